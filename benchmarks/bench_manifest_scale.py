"""Readers of a 400 k-shard dataset: ``dataset.json`` with shards inline vs per-split shard tables.

``python -m benchmarks.bench_manifest_scale [--shards 400000] [--pipelines 64] [--tools ...]
[--repeats 3] [--workdir DIR | --keep DIR]``

Writes one synthetic dataset of ``--shards`` train shards (and 2% as many validation shards)
in both layouts: format version 1 (every shard entry inline in ``dataset.json``, as datasets
were written before shard tables) and format version 2 (``dataset.json`` of a few KB and one
Parquet shard table a split). The entries are as the pipeline writes them (shard and index
file: name, count, size, SHA-256; the hashes random, so they do not compress). Every shard file
is a symbolic link to one file of one tiny PNG record (the reader checks each shard's size, not its
hash), shared by both layouts through ``shard_root``; each split's catalog has one row a shard.

Each tool then runs in a fresh process, layout by layout, timing the call and taking its
resident-memory growth (peak ``VmHWM`` after the call minus ``VmRSS`` before it, imports done):

- ``make_dataset``: ``tfrecord_io.make_dataset`` (training, default ``ReadConfig``) for input
  pipeline 0 of ``--pipelines`` (file sharding) until it returns, and until its first batch,
  TensorFlow's runtime started first;
- ``verify`` start-up: loading the manifest, reading and checking every split's shard table
  (``shard_reports``) and building the first shard's report, what ``verify`` holds before it
  reads a shard (it builds each shard's report as it checks the shard);
- ``diff``: ``diff_datasets`` of the dataset against itself (manifests and catalogs);
- ``inspect``: ``gather`` (manifest, catalogs, shard statistics, one sample a class).

Each figure is the least over ``--repeats`` fresh processes (3). Prints a Markdown table with
both layouts side by side and their ratios.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from benchmarks.common import publish_synthetic_manifest
from catalog.table import build_table, catalog_filename, write_table
from schemas import (
    MANIFEST_NAME,
    FileInfo,
    ImageRecord,
    ShardInfo,
    SplitInfo,
    serialize_record,
    shard_filename,
)
from schemas.framing import write_frame

__all__ = ["write_datasets", "main"]

_LABELS = ("a", "b", "c", "d")
_TOOLS = (
    "make_dataset",
    "make_dataset_exact",
    "split_digest",
    "split_digest_per_entry",
    "verify",
    "diff",
    "inspect",
)
_REPO = Path(__file__).resolve().parent.parent


def _record_file(path: Path) -> int:
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buffer, format="PNG")
    encoded = buffer.getvalue()
    record = ImageRecord(
        encoded=encoded, format="PNG", height=8, width=8, channels=3, label=0, text="a",
        filename="/src/a/0.png", sha256=hashlib.sha256(encoded).hexdigest(),
    )  # fmt: skip
    payload = serialize_record(record)
    with open(path, "wb") as handle:
        write_frame(handle, payload)
    return path.stat().st_size


def _split(shards: Path, catalogs: list[Path], split: str, count: int, size: int) -> SplitInfo:
    rng = np.random.default_rng(len(split))
    digests = rng.bytes(64 * count)
    names = [shard_filename(split, i, count) for i in range(count)]
    for name in names:
        if not (shards / name).exists():
            os.symlink("record.tfrecord", shards / name)  # hard links stop at 65,000
    entries = tuple(
        ShardInfo(
            name, 1, size, digests[64 * i : 64 * i + 32].hex(),
            FileInfo(name[: -len(".tfrecord")] + ".idx", 12, digests[64 * i + 32 : 64 * i + 64].hex()),
        )
        for i, name in enumerate(names)
    )  # fmt: skip
    keys = [hashlib.sha256(f"{split}{i}".encode()).hexdigest() for i in range(count)]
    order = np.argsort(keys)
    table = build_table(
        {
            "key": [keys[i] for i in order],
            "uri": [f"/src/a/{split}-{i}.png" for i in order],
            "label": [0] * count,
            "text": ["a"] * count,
            "split": [split] * count,
            "index": list(range(count)),
            "shard": [names[i] for i in order],
            "record": [0] * count,
            "offset": [0] * count,
            "length": [size] * count,
            "height": [8] * count,
            "width": [8] * count,
            "format": ["PNG"] * count,
        }
    )
    catalog = catalogs[0] / catalog_filename(split)
    write_table(table, str(catalog))
    data = catalog.read_bytes()
    for other in catalogs[1:]:
        (other / catalog.name).write_bytes(data)
    info = FileInfo(catalog.name, len(data), hashlib.sha256(data).hexdigest())
    return SplitInfo(
        count, entries, catalog=info, class_counts={"a": count, "b": 0, "c": 0, "d": 0}
    )


def write_datasets(work: Path, num_shards: int) -> dict[str, Path]:
    """Writes the dataset in both layouts under ``work``; returns ``{layout: root}``."""
    shards, inline, tables = work / "shards", work / "inline", work / "tables"
    for d in (shards, inline, tables):
        d.mkdir(parents=True, exist_ok=True)
    size = _record_file(shards / "record.tfrecord")
    counts = {"train": num_shards, "validation": max(1, num_shards // 50)}
    splits = {
        name: _split(shards, [inline, tables], name, count, size) for name, count in counts.items()
    }
    publish_synthetic_manifest(inline, splits, _LABELS, shard_root=str(shards), format_version=1)
    publish_synthetic_manifest(tables, splits, _LABELS, shard_root=str(shards))
    return {"inline": inline, "tables": tables}


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _measure(tool: str, root: str, pipelines: int) -> dict[str, Any]:
    """Runs one tool on ``root`` in this (fresh) process: imports first, then the timed call."""
    result: dict[str, Any] = {}
    if tool in ("make_dataset", "make_dataset_exact"):
        import tensorflow as tf

        import tfrecord_io

        context = tf.distribute.InputContext(pipelines, 0, 1)
        # TensorFlow's runtime starts once per process, before any dataset: not make_dataset's.
        next(iter(tf.data.Dataset.range(2).map(lambda x: x + 1)))
        config = None
        if tool == "make_dataset_exact":
            # Exact epochs from the start of a run (the trainer's default), with no split
            # digest to check: the digest is timed on its own below.
            total = tfrecord_io.load_manifest(root).split("train").num_examples
            config = tfrecord_io.ReadConfig(exclude=tfrecord_io.DeliveredSet.empty(total))
        rss, start = _status("VmRSS"), time.perf_counter()
        dataset = tfrecord_io.make_dataset(
            root,
            "train",
            global_batch_size=1,
            image_size=8,
            input_context=context,
            read_config=config,
        )
        result["built_s"] = time.perf_counter() - start
        next(iter(dataset))
        result["first_batch_s"] = time.perf_counter() - start
    elif tool in ("split_digest", "split_digest_per_entry"):
        from tfrecord_io.delivery import manifest_split_digest, split_digest
        from tfrecord_io.source import load_manifest

        rss, start = _status("VmRSS"), time.perf_counter()
        manifest = load_manifest(root)
        assert manifest is not None
        shards = manifest.split("train").shards
        if tool == "split_digest":
            result["digest"] = manifest_split_digest(shards)
        else:  # the trainer's computation before columns: a ShardInfo per entry
            result["digest"] = split_digest((s.file, s.num_examples) for s in shards)
    elif tool == "verify":
        from dataset_tools.verify.verification import shard_reports
        from tfrecord_io.source import load_manifest

        rss, start = _status("VmRSS"), time.perf_counter()
        manifest = load_manifest(root)
        assert manifest is not None
        listed = shard_reports(root, manifest)
        result["first"] = next(iter(listed)).file
        result["shards"] = len(listed)
    elif tool == "diff":
        from dataset_tools.diff import diff_datasets

        rss, start = _status("VmRSS"), time.perf_counter()
        diff_datasets(root, root)
    else:
        from dataset_tools.inspect.inspection import gather

        rss, start = _status("VmRSS"), time.perf_counter()
        gather(root, per_class=1)
    result["seconds"] = time.perf_counter() - start
    result["rss_growth_mb"] = (_status("VmHWM") - rss) / 2**20
    return result


def _run(tool: str, root: Path, pipelines: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_manifest_scale", "--measure", tool, str(root),
         "--pipelines", str(pipelines)],
        cwd=_REPO, check=True, capture_output=True, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=400_000)
    parser.add_argument("--pipelines", type=int, default=64)
    parser.add_argument("--tools", default=",".join(_TOOLS))
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per figure")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument(
        "--keep", type=Path, help="write the datasets under this directory, keep and reuse them"
    )
    parser.add_argument("--measure", nargs=2, metavar=("TOOL", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(_measure(args.measure[0], args.measure[1], args.pipelines)))
        return
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = args.keep / f"manifest-scale-{args.shards}" if args.keep else Path(tmp)
        start = time.perf_counter()
        if (work / "tables" / MANIFEST_NAME).exists():
            roots = {"inline": work / "inline", "tables": work / "tables"}
        else:
            roots = write_datasets(work, args.shards)
            print(f"wrote {args.shards:,} train shards in both layouts in "
                  f"{time.perf_counter() - start:.0f} s")  # fmt: skip
        sizes = {
            layout: sum(p.stat().st_size for p in root.iterdir() if p.name.startswith(("dataset", "shards-")))
            for layout, root in roots.items()
        }  # fmt: skip
        print(f"dataset.json inline: {sizes['inline'] / 2**20:.1f} MB; dataset.json + shard "
              f"tables: {sizes['tables'] / 2**20:.1f} MB "
              f"({(roots['tables'] / MANIFEST_NAME).stat().st_size / 1024:.1f} KB + tables)")  # fmt: skip
        print("| tool | inline s | tables s | ratio | inline MB | tables MB | ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for tool in args.tools.split(","):
            runs = {
                layout: [_run(tool, roots[layout], args.pipelines) for _ in range(args.repeats)]
                for layout in ("inline", "tables")
            }
            digests = {run.get("digest") for layout_runs in runs.values() for run in layout_runs}
            if len(digests) > 1:
                raise RuntimeError(f"{tool}: the layouts' split digests differ: {digests}")
            old, new = _best(runs["inline"]), _best(runs["tables"])
            _row(tool, old, new)
            if tool.startswith("make_dataset"):
                _row(f"{tool}, first batch", old, new, key="first_batch_s")


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    # The least of each figure over the runs: what the code costs with the least interference
    # from other work on a shared machine.
    return {key: min(run[key] for run in runs) for key in runs[0] if key not in ("digest", "first")}


def _row(tool: str, old: dict[str, Any], new: dict[str, Any], key: str = "seconds") -> None:
    if key == "seconds" and "built_s" in old:
        key = "built_s"
    o, n = old[key], new[key]
    om, nm = old["rss_growth_mb"], new["rss_growth_mb"]
    print(f"| {tool} | {o:.2f} | {n:.2f} | {o / max(n, 1e-9):.1f}× | {om:.0f} | {nm:.0f} | "
          f"{om / max(nm, 1e-9):.1f}× |")  # fmt: skip


if __name__ == "__main__":
    main()

"""``python -m dataset_tools.diff`` on two synthetic catalogs of ``--examples`` examples (1 M).

``python -m benchmarks.bench_diff [--examples 1000000] [--workdir DIR]``

OLD: ``--examples`` examples over 1,000 classes, 95% train / 5% validation, 1,024 train shards.
NEW: OLD with 2% removed, 3% added, 1% relabelled, 0.5% moved to the other split, 0.5% renamed
and 0.5% re-encoded. Only ``dataset.json`` and the catalogs are written: diff never reads
shards. The diff runs as users run it, in a fresh process (``run_module``), and its wall time,
CPU time and peak RSS are printed as a table row.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.common import run_module
from catalog.table import build_table, catalog_filename, write_table
from dataset_tools.diff import example_frame_lengths
from schemas import MANIFEST_NAME, Counts, ImageSpec, Manifest, ShardInfo, SplitInfo, shard_filename
from schemas.shard_table import encode_manifest

__all__ = ["make_version", "main"]

_CLASSES = 1000
_SHARDS = {"train": 1024, "validation": 64}


def _keys(rng: np.random.Generator, n: int) -> np.ndarray:
    raw = rng.bytes(32 * n)
    return np.array([raw[i : i + 32].hex() for i in range(0, 32 * n, 32)], dtype=object)


def make_version(root: Path, columns: dict[str, np.ndarray], *, image_size: int = 256) -> None:
    """Writes ``dataset.json`` and one catalog per split for the given example columns.

    ``columns``: ``key``, ``label``, ``split`` (0 train, 1 validation), ``uri_id``,
    ``image_len``, ``height``. Rows are ordered as the pipeline stores them (by key in a split).
    """
    root.mkdir(parents=True, exist_ok=True)
    names = tuple(f"class{i:04d}" for i in range(_CLASSES))
    text_dict = pa.array(names)
    splits = {}
    for code, split in enumerate(("train", "validation")):
        chosen = np.flatnonzero(columns["split"] == code)
        keys = columns["key"][chosen]
        order = np.argsort(keys)
        chosen, keys = chosen[order], keys[order]
        n = len(chosen)
        count = _SHARDS[split]
        shard_ids = (np.array([int(k[:8], 16) for k in keys], np.int64) * count) >> 32
        shard_names = pa.array([shard_filename(split, i, count) for i in range(count)])
        labels = columns["label"][chosen]
        uris = pc.binary_join_element_wise(
            "gs://photos/", pa.array(columns["uri_id"][chosen].astype(str)), ".jpg", ""
        )
        texts = text_dict.take(pa.array(labels))
        length = example_frame_lengths(
            columns["image_len"][chosen],
            format_len=np.full(n, 4),
            text_len=np.asarray(pc.binary_length(texts)),
            uri_len=np.asarray(pc.binary_length(uris)),
            label=labels,
            height=columns["height"][chosen],
            width=np.full(n, 320),
        )
        record = np.arange(n) - np.searchsorted(shard_ids, shard_ids)
        table = build_table(
            {
                "key": pa.array(keys.tolist(), pa.string()),
                "uri": uris,
                "label": labels,
                "text": texts,
                "split": pa.array([split] * n),
                "index": np.arange(n),
                "shard": shard_names.take(pa.array(shard_ids)),
                "record": record,
                "offset": np.cumsum(length) - length,
                "length": length,
                "height": columns["height"][chosen].astype(np.int32),
                "width": np.full(n, 320, np.int32),
                "format": pa.array(["JPEG"] * n),
            }
        )
        write_table(table, str(root / catalog_filename(split)))
        per_shard = np.bincount(shard_ids, minlength=count)
        shards = tuple(
            ShardInfo(shard_filename(split, i, count), int(per_shard[i]), 1, "0" * 64)
            for i in range(count)
        )
        splits[split] = SplitInfo(n, shards)
    total = len(columns["key"])
    manifest = Manifest(
        label_names=names,
        splits=splits,
        counts=Counts(input=total, written=total, rejected=0, duplicates=0),
        image=ImageSpec(encoding="jpeg", image_size=image_size, crop="none"),
        options={"image_size": image_size, "encoding": "jpeg", "crop": "none"},
    )
    text, tables = encode_manifest(manifest)  # shard tables first, dataset.json last
    for name, data in tables.items():
        (root / name).write_bytes(data)
    (root / MANIFEST_NAME).write_text(text)


def _versions(workdir: Path, n: int, seed: int = 0) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    old = {
        "key": _keys(rng, n),
        "label": rng.integers(0, _CLASSES, n),
        "split": (rng.random(n) < 0.05).astype(np.int64),
        "uri_id": np.arange(n),
        "image_len": rng.integers(20_000, 200_000, n),
        "height": np.full(n, 256),
    }
    make_version(workdir / "old", old)
    keep = rng.random(n) >= 0.02
    new = {name: values[keep].copy() for name, values in old.items()}
    m = len(new["key"])

    def some(share: float) -> np.ndarray:
        return rng.random(m) < share

    relabel = some(0.01)
    new["label"][relabel] = (new["label"][relabel] + 1) % _CLASSES
    move = some(0.005)
    new["split"][move] = 1 - new["split"][move]
    new["uri_id"][some(0.005)] += 10 * n
    reencode = some(0.005)
    new["height"][reencode] = 224
    new["image_len"][reencode] = new["image_len"][reencode] * 7 // 8
    added = int(n * 0.03)
    extra = {
        "key": _keys(rng, added),
        "label": rng.integers(0, _CLASSES, added),
        "split": (rng.random(added) < 0.05).astype(np.int64),
        "uri_id": np.arange(n, n + added),
        "image_len": rng.integers(20_000, 200_000, added),
        "height": np.full(added, 256),
    }
    make_version(
        workdir / "new", {k: np.concatenate([new[k], extra[k]]) for k in new}, image_size=256
    )
    return workdir / "old", workdir / "new"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=1_000_000)
    parser.add_argument("--workdir", default=None, help="keep the catalogs here (default: temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_diff-") as tmp:
        workdir = Path(args.workdir or tmp)
        start = time.perf_counter()
        old, new = _versions(workdir, args.examples)
        made = time.perf_counter() - start
        sizes = {p.name: os.path.getsize(p) for p in (old, new) for p in p.glob("catalog-*")}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = run_module("dataset_tools.diff", [str(old), str(new), "--json", "--limit", "5"])
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        totals = json.loads(out)["totals"]
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        print(f"catalogs written in {made:.1f} s; bytes {sizes}")
        print(f"load average {os.getloadavg()[0]:.2f} (machine shared with other work)")
        print("| examples (old / new) | wall s | CPU s | peak RSS MB | totals |")
        print("|---|---|---|---|---|")
        print(
            f"| {totals['old']:,} / {totals['new']:,} | {wall:.2f} | {cpu:.2f} | "
            f"{after.ru_maxrss / 1024:.0f} | added {totals['added']:,}, removed "
            f"{totals['removed']:,}, relabelled {totals['relabelled']:,}, moved "
            f"{totals['moved']:,}, renamed {totals['renamed']:,}, reencoded "
            f"{totals['reencoded']:,} |"
        )


if __name__ == "__main__":
    main()

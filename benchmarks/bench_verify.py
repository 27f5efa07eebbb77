"""``verify``'s cost per shard: the same records in ``--shards`` tiny shards and in one shard.

``python -m benchmarks.bench_verify [--shards 2000] [--records_per_shard 1]``

Both datasets hold the same ``shards * records_per_shard`` small PNG examples (about 300 bytes
each) with index files and catalogs, as the pipeline publishes them. Each is verified in a
fresh process (``python -m dataset_tools.verify DATASET --json``); the per-shard overhead is
``(T_many - T_one) / (shards - 1)``, in wall and CPU time.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.common import publish_synthetic_manifest, run_module
from catalog.index_files import entries_from_payload_sizes, format_index, index_filename
from catalog.table import build_table, catalog_filename, write_table
from schemas import FileInfo, ImageRecord, ShardInfo, SplitInfo, serialize_record, shard_filename
from schemas.framing import write_frame

__all__ = ["write_tiny_dataset", "main"]

_LABELS = ("a", "b", "c", "d")


def _records(n: int) -> list[ImageRecord]:
    rng = np.random.default_rng(0)
    records = []
    for i in range(n):
        pixels = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        encoded = buffer.getvalue()
        label = i % len(_LABELS)
        records.append(
            ImageRecord(
                encoded=encoded, format="PNG", height=8, width=8, channels=3, label=label,
                text=_LABELS[label], filename=f"/src/{_LABELS[label]}/{i}.png",
                sha256=hashlib.sha256(encoded + i.to_bytes(4, "little")).hexdigest(),
            )
        )  # fmt: skip
    return sorted(records, key=lambda r: r.sha256)


def _file_info(path: Path) -> FileInfo:
    data = path.read_bytes()
    return FileInfo(path.name, len(data), hashlib.sha256(data).hexdigest())


def write_tiny_dataset(root: Path, records: list[ImageRecord], num_shards: int) -> None:
    """Writes ``records`` (key order) as ``num_shards`` train shards with index files, a
    catalog and ``dataset.json``, laid out as the pipeline publishes them."""
    root.mkdir(parents=True)
    per_shard = np.array_split(np.arange(len(records)), num_shards)
    shards, columns = [], {name: [] for name in ("key", "uri", "label", "text", "split")}
    location = {name: [] for name in ("index", "shard", "record", "offset", "length")}
    for number, chosen in enumerate(per_shard):
        name = shard_filename("train", number, num_shards)
        payloads = [serialize_record(records[i]) for i in chosen]
        with open(root / name, "wb") as handle:
            for payload in payloads:
                write_frame(handle, payload)
        entries = entries_from_payload_sizes(len(p) for p in payloads)
        (root / index_filename(name)).write_bytes(format_index(entries))
        for position, (i, (offset, length)) in enumerate(zip(chosen, entries, strict=True)):
            r = records[i]
            for key, value in (("key", r.sha256), ("uri", r.filename), ("label", r.label),
                               ("text", r.text), ("split", "train")):  # fmt: skip
                columns[key].append(value)
            location["index"].append(int(i))
            location["shard"].append(name)
            location["record"].append(position)
            location["offset"].append(int(offset))
            location["length"].append(int(length))
        info = _file_info(root / name)
        shards.append(
            ShardInfo(name, len(chosen), info.num_bytes, info.sha256,
                      index=_file_info(root / index_filename(name)))
        )  # fmt: skip
    n = len(records)
    table = build_table(
        {**columns, **location, "height": [8] * n, "width": [8] * n, "format": ["PNG"] * n}
    )
    write_table(table, str(root / catalog_filename("train")))
    catalog = _file_info(root / "catalog-train.parquet")
    publish_synthetic_manifest(
        root, {"train": SplitInfo(n, tuple(shards), catalog=catalog)}, _LABELS
    )


def _verify(root: Path) -> tuple[float, float, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = run_module(
        "dataset_tools.verify",
        [str(root), "--json", "--no-progress"],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    report = json.loads(out)
    if not report["ok"]:
        raise RuntimeError(f"verify failed on {root}: {json.dumps(report)[:2000]}")
    return wall, cpu, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=2000)
    parser.add_argument("--records_per_shard", type=int, default=1)
    args = parser.parse_args()
    records = _records(args.shards * args.records_per_shard)
    with tempfile.TemporaryDirectory(prefix="bench_verify-") as tmp:
        many, one = Path(tmp) / "many", Path(tmp) / "one"
        write_tiny_dataset(many, records, args.shards)
        write_tiny_dataset(one, records, 1)
        wall_one, cpu_one, _ = _verify(one)
        wall_many, cpu_many, report = _verify(many)
    per_wall = (wall_many - wall_one) / (args.shards - 1) * 1000
    per_cpu = (cpu_many - cpu_one) / (args.shards - 1) * 1000
    print(f"load average {os.getloadavg()[0]:.2f} (machine shared with other work)")
    print("| records | shards | wall s (1 shard) | wall s | CPU s (1 shard) | CPU s | "
          "per-shard overhead, wall ms | per-shard overhead, CPU ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {report['num_records']:,} | {args.shards:,} | {wall_one:.2f} | {wall_many:.2f} | "
        f"{cpu_one:.2f} | {cpu_many:.2f} | {per_wall:.2f} | {per_cpu:.2f} |"
    )


if __name__ == "__main__":
    main()

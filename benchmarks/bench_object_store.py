"""Benchmark: the reader streaming shards from a local S3 server (moto) against local disk.

The dataset is ImageNet-like photos (500x375, quality 90) written once by the pipeline as JPEG
shards at ``--image_size 256``, then uploaded to a bucket on ``python -m moto.server`` started on
loopback by this script. Rows, each one epoch of ``make_dataset(training=True, num_epochs=1)``
(random crop 224, flip, uint8 batches of 64, 8 shards interleaved, a 256-example shuffle
buffer so that an epoch streams rather than first reading the whole set), measured in the same process and interleaved
round by round so that they share the machine's noise:

  * local disk: the dataset directory.
  * S3, first epoch: an empty shard cache with download-ahead (the default 4 shards ahead, 4
    download threads); every shard is fetched from moto, SHA-256 checked, then read.
  * S3, second epoch: the same cache, now warm (no downloads).
  * S3, first epoch, half-size cache: ``cache_bytes`` half of the dataset (still room for the
    shards being read and those downloaded ahead), so the cache evicts as it goes.

The moto server runs on the same cores as the reader, as a real deployment's network stack
would. Target: the first epoch from S3 reaches at least 50% of local-disk examples/s.

Usage::

  python -m benchmarks.bench_object_store [--n 3000] [--shards 24] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tests.fixtures.processes import free_ports

__all__ = ["main", "measure_epoch"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
BATCH = 64
CYCLE_LENGTH = 8
SHUFFLE_BUFFER = 256
BUCKET = "bench-object-store"


def _start_moto(log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=2).read()
            return process, url
        except urllib.error.HTTPError:
            return process, url
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"moto.server exited: {log_path.read_text()}") from None
            time.sleep(0.1)
    process.terminate()
    raise RuntimeError(f"moto.server did not start: {log_path.read_text()}")


def _prepare(workdir: Path, n: int, shards: int) -> Path:
    from beam_pipelines import images_to_tfrecord
    from beam_pipelines.samples import write_imagenet_like_jpegs

    images, dataset = workdir / "images", workdir / "dataset"
    write_imagenet_like_jpegs(images, n)
    code = images_to_tfrecord.main(
        [
            "--input",
            str(images),
            "--output",
            str(dataset),
            "--image_size",
            "256",
            "--num_shards",
            str(shards),
        ]
    )
    if code != 0:
        raise RuntimeError(f"the pipeline failed with exit status {code}")
    return dataset


def _process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_epoch(source: str) -> tuple[float, int]:
    """One training epoch of ``make_dataset(source)``; returns (seconds, examples)."""
    from tfrecord_io import ReadConfig, make_dataset

    dataset = make_dataset(
        source,
        "train",
        global_batch_size=BATCH,
        training=True,
        seed=0,
        read_config=ReadConfig(
            num_epochs=1, cycle_length=CYCLE_LENGTH, shuffle_buffer=SHUFFLE_BUFFER
        ),
    )
    start = time.perf_counter()
    examples = 0
    for images, _ in dataset:
        examples += int(images.shape[0])
    return time.perf_counter() - start, examples


def _close_cache(source: str) -> None:
    from tfrecord_io.source import resolve_source

    cache = resolve_source(source, "train").shard_cache()
    if cache is not None:
        cache.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000, help="images (default 3000)")
    parser.add_argument("--shards", type=int, default=24, help="shards (default 24)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, median reported (3)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 200 images, 1 round")
    parser.add_argument(
        "--json", default=str(RESULTS_DIR / "object_store.json"), help="results file ('' for none)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.shards, args.rounds = 200, 8, 1
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    workdir = Path(tempfile.mkdtemp(prefix="bench-object-store-"))
    moto = None
    try:
        print(f"preparing {args.n} ImageNet-like JPEGs -> {args.shards} JPEG-256 shards ...")
        dataset = _prepare(workdir, args.n, args.shards)
        dataset_bytes = sum(p.stat().st_size for p in dataset.glob("*.tfrecord"))
        moto, url = _start_moto(workdir / "moto.log")
        os.environ.update(
            AWS_ENDPOINT_URL=url,
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench-secret",
            AWS_DEFAULT_REGION="us-east-1",
        )
        from objstore import get_store, join_uri

        store = get_store(f"s3://{BUCKET}")
        store.create_bucket(f"s3://{BUCKET}")
        for path in sorted(dataset.iterdir()):
            store.write_bytes(join_uri(f"s3://{BUCKET}", "dataset", path.name), path.read_bytes())
        remote = f"s3://{BUCKET}/dataset"

        names = (
            "local disk",
            "S3, first epoch",
            "S3, second epoch (warm cache)",
            "S3, first epoch, cache = 1/2 of data",
        )
        # row -> [(examples/s, reader CPU ms/example, server CPU ms/example)], one per round
        rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
        examples = 0

        def timed(name: str, source: str) -> None:
            nonlocal examples
            cpu, server = time.process_time(), _process_cpu_s(moto.pid)
            seconds, examples = measure_epoch(source)
            cpu, server = time.process_time() - cpu, _process_cpu_s(moto.pid) - server
            rows[name].append((examples / seconds, 1e3 * cpu / examples, 1e3 * server / examples))

        measure_epoch(str(dataset))  # warm-up: the process's first pipeline pays one-time costs
        for round_index in range(args.rounds):
            timed("local disk", str(dataset))
            os.environ["TFRECORD_IO_CACHE_DIR"] = str(workdir / f"cache-{round_index}")
            os.environ.pop("TFRECORD_IO_CACHE_BYTES", None)
            timed("S3, first epoch", remote)
            timed("S3, second epoch (warm cache)", remote)
            _close_cache(remote)
            os.environ["TFRECORD_IO_CACHE_DIR"] = str(workdir / f"small-cache-{round_index}")
            os.environ["TFRECORD_IO_CACHE_BYTES"] = str(max(dataset_bytes // 2, 1))
            timed("S3, first epoch, cache = 1/2 of data", remote)
            _close_cache(remote)
            print(f"round {round_index + 1}/{args.rounds} done")

        def median(name: str, column: int) -> float:
            return statistics.median(row[column] for row in rows[name])

        local = median("local disk", 0)
        conditions = {
            "images": args.n,
            "examples": examples,
            "shards": args.shards,
            "dataset_mb": round(dataset_bytes / 1e6, 1),
            "batch": BATCH,
            "cycle_length": CYCLE_LENGTH,
            "shuffle_buffer": SHUFFLE_BUFFER,
            "rounds": args.rounds,
            "cpus": os.cpu_count(),
            "load_average": [round(x, 1) for x in os.getloadavg()],
        }
        print()
        print(
            f"{examples} examples, {conditions['dataset_mb']} MB in {args.shards} shards, "
            f"batch {BATCH}, cycle {CYCLE_LENGTH}, median of {args.rounds} round(s), "
            f"load {conditions['load_average']}"
        )
        print(
            f"{'row':<40} {'examples/s':>11} {'vs local':>9} {'reader CPU ms/ex':>17} "
            f"{'S3 server CPU ms/ex':>20}"
        )
        results = []
        for name in names:
            value, cpu, server = (median(name, c) for c in range(3))
            results.append(
                {
                    "row": name,
                    "examples_per_s": round(value, 1),
                    "vs_local": round(value / local, 3),
                    "reader_cpu_ms_per_example": round(cpu, 3),
                    "server_cpu_ms_per_example": round(server, 3),
                }
            )
            print(f"{name:<40} {value:>11.0f} {value / local:>8.0%} {cpu:>17.2f} {server:>20.2f}")
        ratio = median("S3, first epoch", 0) / local
        verdict = "met" if ratio >= 0.5 else "NOT met"
        print(f"\ntarget: S3 first epoch >= 50% of local disk: {ratio:.0%}, {verdict}")
        if args.json and not args.quick:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(
                json.dumps({"conditions": conditions, "rows": results}, indent=2) + "\n"
            )
        return 0
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

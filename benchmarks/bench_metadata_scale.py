"""The metadata path at scale, simulated: a build of N images with no pixels.

Every step of a real build runs except the image step: the listing (a ``uri,label`` CSV of
synthetic URIs, read by ``ListSources``), the shard plan, the split, the exact dedup in the
shard writer, the near-duplicate search, the shard writer itself, the catalog merge, the
near-duplicate and rejection reports and the manifest (``images_to_tfrecord.run``, published).
The image step is replaced by ``SimulatedPrepareImages``, which makes each input's metadata
from its number alone: a content hash (one input in 997 a byte-identical copy of the one
before), a perceptual hash (one in 499 two bits from the one before: a near-duplicate pair),
a source size of 40-200 KB and a label; and stages a stand-in example of ``--stand_in_bytes``
through the real staging area (``staging.RecordStager``), so the shard writer, index files and
catalogs run as they do, on tiny examples. Shard counts are planned as for real images
(``plan.estimated_example_bytes``), so the manifest has the shard entries a real build of N
images would have.

The seam: the build runs ``ImagesToShards`` with ``transforms.PrepareImages`` replaced by
``SimulatedPrepareImages`` (same arguments, same outputs), set in the build process before the
graph is built. Nothing in the pipeline changes.

Each build runs in a fresh process (``bench_scale.measured_run``): CPU seconds of the process
and everything it reaped, peak RSS of the whole process tree and of each process. ``dask``
builds start a scheduler and two one-thread workers inside that process tree
(``tests/fixtures/dask_cluster.py``). ``flink`` and ``spark`` builds run on a local cluster (a
fresh one per build, or the one ``--flink_cluster``/``--spark_cluster`` names), measured by
process role with the disk their shuffles spill to (``benchmarks/metadata_on_engines.py``).

Usage::

  python -m benchmarks.bench_metadata_scale --sizes 1000000,3000000 --modes inprocess,dask
  python -m benchmarks.bench_metadata_scale --sizes 20000 --modes inprocess   # smoke run
  python -m benchmarks.bench_metadata_scale --sizes 1000000,3000000 --modes flink,spark \\
      --work /big/disk --json rows.json
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from beam_pipelines.elements import CatalogMeta, SourceFile
from beam_pipelines.inputs.sources import unpack_sources
from beam_pipelines.output.staging import DEFAULT_FILE_BYTES, RecordStager
from benchmarks.common import exit_on_sigterm
from benchmarks.metadata_on_engines import ENGINE_MODES, engine_run
from schemas.image_example import ImageRecord, serialize_record

__all__ = ["SimulatedPrepareImages", "simulated_meta", "write_listing", "main"]

NUM_CLASSES = 1000
DUPLICATE_EVERY = 997  # input i with i % 997 == 1 is a byte copy of input i - 1
NEAR_EVERY = 499  # input i with i % 499 == 2 has input i - 1's perceptual hash, 2 bits off
_STAND_IN = b"\xff\xd8\xff\xe0" + bytes(60)  # JPEG-looking; nobody decodes it


def _content(i: int) -> int:
    """Which content input ``i`` holds: its own, or the one before's (an exact duplicate)."""
    return i - 1 if i % DUPLICATE_EVERY == 1 else i


def _label(i: int) -> int:
    # Of the content, so that a byte copy is filed under the same class (no label conflict).
    return _content(i) * 7919 % NUM_CLASSES


def _phash(i: int) -> int:
    if i % NEAR_EVERY == 2:
        return _phash(i - 1) ^ (1 << 3 | 1 << 40)
    digest = hashlib.blake2b(b"p%d" % _content(i), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1)  # a signed 64-bit column


def simulated_meta(i: int) -> tuple[str, CatalogMeta]:
    """Input ``i``'s content hash and catalog metadata, as the image step would make them."""
    content = _content(i)
    sha256 = hashlib.sha256(b"simulated image %d" % content).hexdigest()
    label = _label(i)
    source_bytes = 40_000 + int(sha256[:8], 16) % 160_000
    meta = CatalogMeta(
        label=label,
        text=f"class{label:04d}",
        height=256,
        width=341,
        format="JPEG",
        source_format="JPEG",
        source_bytes=source_bytes,
        source_height=375,
        source_width=500,
        phash=_phash(i),
    )
    return sha256, meta


def write_listing(path: Path, n: int) -> None:
    """A ``uri,label`` listing of ``n`` synthetic inputs (relative URIs, never opened)."""
    with path.open("w") as out:
        out.write("uri,label\n")
        for i in range(n):
            out.write(f"class{_label(i):04d}/{i:010d}.jpg,class{_label(i):04d}\n")


class _SimulatedPrepareFn(beam.DoFn):
    """``SourceFile`` (or a packed batch) ``-> StagedRecord`` of a stand-in example.

    Side input ``label_names``, as ``transforms.PrepareImageFn`` takes it: the label is the
    position of the input's class name among them. The side input is also what places the
    step in the runner's graph as the real one: it waits for the class names, so it runs in a
    stage of its own after the listing's (which also counts the inputs for the shard plan).
    Without it the in-process runner fuses it into the listing's stage, and the shard
    assignment, which waits for the plan, reads every record from a buffer held whole (about
    1.7 KB of RSS an image) that a real build never holds.
    """

    def __init__(self, staging: str, staging_file_bytes: int, stand_in_bytes: int) -> None:
        self._staging = staging
        self._file_bytes = staging_file_bytes
        self._encoded = (_STAND_IN * (1 + stand_in_bytes // len(_STAND_IN)))[:stand_in_bytes]
        self._stager: RecordStager | None = None
        self._names: tuple[str, ...] | None = None
        self._index: dict[str, int] = {}

    def start_bundle(self) -> None:
        self._stager = RecordStager(self._staging, max_file_bytes=self._file_bytes)

    def finish_bundle(self):
        assert self._stager is not None
        for staged in self._stager.flush():
            yield GlobalWindows.windowed_value(staged)

    def process(self, element: SourceFile | bytes, label_names: tuple[str, ...]):
        assert self._stager is not None
        if label_names is not self._names:
            self._names, self._index = label_names, {n: i for i, n in enumerate(label_names)}
        for source in unpack_sources(element) if isinstance(element, bytes) else [element]:
            i = int(source.uri.rsplit("/", 1)[1].split(".")[0])
            sha256, meta = simulated_meta(i)
            meta = meta._replace(label=self._index[meta.text])
            record = ImageRecord(
                encoded=self._encoded, format="JPEG", height=meta.height, width=meta.width,
                channels=3, label=meta.label, text=meta.text, filename=source.uri, sha256=sha256,
            )  # fmt: skip
            yield from self._stager.add(sha256, source.uri, serialize_record(record), meta)


class SimulatedPrepareImages(beam.PTransform):
    """Stands in for ``transforms.PrepareImages``: the same arguments and outputs (``records``
    and an empty ``rejected``), metadata from each input's number instead of its pixels."""

    stand_in_bytes = 64

    def __init__(self, options, label_names, progress=None, *, staging=None,
                 staging_file_bytes=DEFAULT_FILE_BYTES, base=None, total=None,
                 threads=1) -> None:  # fmt: skip
        super().__init__()
        if staging is None or base is not None:
            raise ValueError("the simulation stages its stand-ins and takes no --base")
        self._staging = staging
        self._file_bytes = staging_file_bytes
        self._label_names = label_names

    def expand(self, sources):
        records = sources | "Simulate" >> beam.ParDo(
            _SimulatedPrepareFn(self._staging, self._file_bytes, self.stand_in_bytes),
            beam.pvalue.AsSingleton(self._label_names),
        )
        rejected = sources.pipeline | "NoRejections" >> beam.Create([])
        return _Outputs(records=records, rejected=rejected)


class _Outputs(dict):
    """``prepared.records`` and ``prepared["rejected"]``, as ``with_outputs`` gives them."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(name) from e


def _simulate(stand_in_bytes: int) -> None:
    """Makes builds in this process simulate their image step (the seam)."""
    import cloudpickle

    from beam_pipelines.graph import transforms

    # Dask workers have the project installed but not benchmarks/: ship this module by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    SimulatedPrepareImages.stand_in_bytes = stand_in_bytes
    transforms.PrepareImages = SimulatedPrepareImages  # type: ignore[misc]


def _build(argv: Sequence[str]) -> int:
    """One simulated build, in this process: ``build [--dask] [--stand_in_bytes B] FLAGS``."""
    parser = argparse.ArgumentParser(prog="bench_metadata_scale build")
    parser.add_argument("--dask", action="store_true")
    parser.add_argument("--stand_in_bytes", type=int, default=64)
    parser.add_argument("--dask_memory_limit", default="6GiB")
    parser.add_argument("--dask_memory_target", type=float)
    args, flags = parser.parse_known_args(argv)
    from beam_pipelines import images_to_tfrecord

    _simulate(args.stand_in_bytes)
    if not args.dask:
        return images_to_tfrecord.main(flags)
    from tests.fixtures.dask_cluster import local_dask_cluster

    if args.dask_memory_target is not None:  # read by the workers the cluster starts
        os.environ["DASK_DISTRIBUTED__WORKER__MEMORY__TARGET"] = str(args.dask_memory_target)
    with local_dask_cluster(2, memory_limit=args.dask_memory_limit) as cluster:
        return images_to_tfrecord.main([*flags, *cluster.runner_args()])


def _dask_flags(args: argparse.Namespace) -> list[str]:
    target = args.dask_memory_target
    return [
        "--dask", "--dask_memory_limit", args.dask_memory_limit,
        *(["--dask_memory_target", str(target)] if target is not None else []),
    ]  # fmt: skip


def _run(args: argparse.Namespace, work: Path, n: int, mode: str) -> dict:
    """One measured build of ``n`` simulated images; its measures, shards and manifest size."""
    import json

    from benchmarks.bench_scale import measured_run

    listing = work / f"listing-{n}" / "inputs.csv"
    listing.parent.mkdir(parents=True, exist_ok=True)
    write_listing(listing, n)
    out = work / f"out-{mode}-{n}"
    flags = [
        "build", "--stand_in_bytes", str(args.stand_in_bytes),
        *(_dask_flags(args) if mode == "dask" else []),
        "--input", str(listing), "--output", str(out), "--overwrite", "--progress", "off",
        "--validation_fraction", "0.02", *args.pipeline_flag,
    ]  # fmt: skip
    if mode in ENGINE_MODES:
        r = engine_run(flags, mode, work / f"{mode}-{n}", n, getattr(args, f"{mode}_cluster"))
    else:
        r = measured_run(flags, module="benchmarks.bench_metadata_scale", cwd=str(_REPO))
    manifest = out / "dataset.json"
    data = json.loads(manifest.read_text())
    # Format version 2 counts shards in dataset.json; version 1 listed them inline.
    r["shards"] = sum(
        s.get("num_shards", len(s.get("shards", []))) for s in data["splits"].values()
    )
    r["manifest_kb"] = manifest.stat().st_size / 1024
    r["shard_tables_kb"] = sum(p.stat().st_size for p in out.glob("shards-*.parquet")) / 1024
    r["catalog_mb"] = sum(p.stat().st_size for p in out.glob("catalog-*.parquet")) / 2**20
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(listing.parent, ignore_errors=True)
    return r


def _json_rows(mode: str, n: int, r: dict, base: dict) -> list[dict]:
    """The ``--json`` rows of one build: one per process role, its largest process's peak RSS;
    ``cpu_us_per_image`` is the whole build's, ``role_cpu_us_per_image`` the role's (engines)."""
    per_image = (r["cpu_s"] - base["cpu_s"]) / (n - base["images"]) * 1e6
    rows = []
    for role, mb in [("all processes", r["peak_mb"]), *r["each_mb"]]:
        row = {"mode": mode, "images": n, "role": role, "peak_rss_mb": round(mb, 1),
               "cpu_us_per_image": round(per_image, 1)}  # fmt: skip
        if role in r.get("role_cpu_s", {}):
            role_cpu = r["role_cpu_s"][role] - base.get("role_cpu_s", {}).get(role, 0.0)
            row["role_cpu_us_per_image"] = round(role_cpu / (n - base["images"]) * 1e6, 1)
        rows.append(row)
    if "spill_mb" in r:
        rows[0]["spill_disk_mb"] = round(r["spill_mb"], 1)
    rows[0]["wall_s"] = round(r["wall_s"], 1)
    rows[0]["load_at_end"] = os.getloadavg()[0]
    return rows


def _largest_per_role(each_mb: list[tuple[str, float]]) -> list[tuple[str, float]]:
    found: dict[str, float] = {}
    for role, mb in each_mb:
        found[role] = max(found.get(role, 0.0), mb)
    return sorted(found.items(), key=lambda x: -x[1])


def _measure(args: argparse.Namespace, work: Path) -> None:
    import json

    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    print(
        f"metadata path, simulated: {NUM_CLASSES} classes, stand-in examples of "
        f"{args.stand_in_bytes} B, --validation_fraction 0.02, other options default; "
        f"CPU µs/image is (CPU(N) - CPU({args.baseline:,})) / (N - {args.baseline:,}), the "
        f"start-up of a build left out; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
        "CPUs at start"
    )
    print("| images | mode | CPU µs/image | CPU s | wall s | peak RSS MB (all) | "
          "largest process MB | shards | dataset.json KB | catalogs MB | spill MB |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    rows: list[dict] = []
    for mode in modes:
        base = _run(args, work, args.baseline, mode)
        base["images"] = args.baseline
        for n in sizes:
            r = _run(args, work, n, mode)
            r["each_mb"] = _largest_per_role(r["each_mb"])
            role, largest = r["each_mb"][0]
            marginal = (r["cpu_s"] - base["cpu_s"]) / (n - args.baseline) * 1e6
            spill = f"{r['spill_mb']:,.0f}" if "spill_mb" in r else "-"
            print(
                f"| {n:,} | {mode} | {marginal:,.0f} | {r['cpu_s']:,.0f} | {r['wall_s']:,.0f} | "
                f"{r['peak_mb']:,.0f} | {role} {largest:,.0f} | {r['shards']:,} | "
                f"{r['manifest_kb']:,.0f} | {r['catalog_mb']:,.1f} | {spill} |",
                flush=True,
            )
            each = ", ".join(f"{role} {mb:,.0f}" for role, mb in r["each_mb"][:8])
            print(f"|   | each role's largest process, MB: {each}; load "
                  f"{os.getloadavg()[0]:.1f} |", flush=True)  # fmt: skip
            if "role_cpu_s" in r:
                cpu = ", ".join(
                    f"{role} {(s - base['role_cpu_s'].get(role, 0.0)) / (n - args.baseline) * 1e6:,.0f}"
                    for role, s in sorted(r["role_cpu_s"].items(), key=lambda x: -x[1])
                )
                print(f"|   | CPU µs/image by role: {cpu} |", flush=True)
            rows += _json_rows(mode, n, r, base)
            if args.json:  # after every build: a long run's finished rows survive its end
                Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"load {os.getloadavg()[0]:.1f} at end")


def _buffers(args: argparse.Namespace, work: Path) -> None:
    """What the in-process runner holds between steps, per image, at each size: the steps
    whose buffers grow with the images are the ones that hold everything at once."""
    from beam_pipelines.images_to_tfrecord import run
    from benchmarks.bench_scale import runner_buffers

    _simulate(args.stand_in_bytes)
    sizes = [int(s) for s in args.sizes.split(",")]
    found: dict[int, dict[str, int]] = {}
    for n in sizes:
        listing = work / f"listing-{n}" / "inputs.csv"
        listing.parent.mkdir(parents=True, exist_ok=True)
        write_listing(listing, n)
        out = work / f"out-buffers-{n}"
        with runner_buffers() as peaks:
            run(["--input", str(listing), "--output", str(out), "--overwrite", "--progress",
                 "off", "--validation_fraction", "0.02", *args.pipeline_flag])  # fmt: skip
        found[n] = dict(peaks)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(listing.parent, ignore_errors=True)
    largest = max(sizes)
    print("buffers: what the in-process runner holds between steps, largest size seen, bytes")
    print("per simulated image")
    print("| buffered | " + " | ".join(f"{n:,} images" for n in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    for name in sorted(found[largest], key=lambda name: -found[largest][name]):
        if found[largest][name] >= largest:  # at least a byte per image somewhere
            cells = " | ".join(f"{found[n].get(name, 0) / n:,.1f}" for n in sizes)
            print(f"| {name} | {cells} |")


_REPO = Path(__file__).resolve().parents[1]


def main(argv: Sequence[str] | None = None) -> int:
    """Measures simulated builds at ``--sizes`` on each of ``--modes``; prints a table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["build"]:
        return _build(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000000,3000000,10000000")
    parser.add_argument(
        "--buffers", action="store_true",
        help="instead: what the in-process runner holds between steps, per image",
    )  # fmt: skip
    parser.add_argument(
        "--modes", default="inprocess,dask", help="inprocess, dask, flink, spark (comma-separated)"
    )
    for engine in ENGINE_MODES:
        parser.add_argument(
            f"--{engine}_cluster", metavar="DIR",
            help=f"run the {engine} builds on the cluster that `scripts/engines/cluster.py start "
            f"{engine} DIR` started (default: a fresh cluster for every build, in --work)",
        )  # fmt: skip
    parser.add_argument(
        "--json", metavar="PATH",
        help="also write the rows as JSON: one per mode, size and process role (its largest "
        "process): mode, images, role, peak_rss_mb, cpu_us_per_image",
    )  # fmt: skip
    parser.add_argument("--stand_in_bytes", type=int, default=64)
    parser.add_argument(
        "--dask_memory_limit", default="6GiB",
        help="each of the two Dask workers' memory limit",
    )  # fmt: skip
    parser.add_argument(
        "--dask_memory_target", type=float,
        help="the fraction of the limit past which a Dask worker spills the results it holds "
        "to disk (Dask's distributed.worker.memory.target; its default is 0.6)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", type=int, default=2000, help="the small build whose CPU is subtracted"
    )
    parser.add_argument("--work", help="scratch directory (default: a temporary one)")
    parser.add_argument(
        "--pipeline_flag", action="append", default=[],
        help="one more pipeline flag (repeatable; e.g. --pipeline_flag=--leakage=move_to_train)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    exit_on_sigterm()  # the clusters this starts stop on SIGTERM too
    measure = _buffers if args.buffers else _measure
    if args.work:
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        measure(args, work)
    else:
        with tempfile.TemporaryDirectory(prefix="metadata-scale-") as tmp:
            measure(args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())

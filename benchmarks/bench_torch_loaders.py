"""Benchmark: the loaders PyTorch teams use against ours, side by side in one run.

The same ImageNet-like photos (``benchmarks/photo_families.py``, ``imagenet_like``; 2,000 by
default) are written by each system as its users would:
  * ours: the pipeline (``python -m beam_pipelines.images_to_tfrecord``) at ``--image_size 256``
    (JPEG q90) and at ``--image_size 224 --crop center --encoding raw`` (RAW), as bench_reader;
  * MosaicML Streaming 0.13.0, LitData 0.2.76 and webdataset 1.0.2 (``torch_loader_peers``): the
    pipeline's own per-image step (``prepare_image``, Pillow) makes each photo's 256 px JPEG q90
    bytes and RAW 224x224x3 centre crop once, and every peer stores those same bytes, with a
    sample id.
Rows, each for JPEG and RAW: the three peers (torchvision ``decode_jpeg``, ``RandomResizedCrop``
224 and flip for JPEG, flip for RAW, batch 32, a DataLoader with two persistent workers, uint8
CHW); ours through ``tfrecord_io.torch`` (``dataset(root, "train", global_batch_size=32,
training=True, seed=0, image_size=224)``, whole batches) and torchdata's ``StatefulDataLoader``
(two persistent workers); ours through the tf.data reader (``make_dataset``, no DataLoader).

Figures, per row:
  * examples/s over one epoch in steady state: the first ``--warmup_batches`` are discarded and
    the last ``--tail_batches`` are left out too, so the loader's read-ahead is full at both
    ends of the timed window;
  * CPU-ms per example over the whole process tree over that window: user + system time of the
    main process and every descendant (DataLoader workers, helpers), with what they reaped,
    sampled with psutil while the persistent workers are alive;
  * time to the first batch after a resume from a mid-epoch checkpoint, through each system's
    own API (webdataset has none): from building the dataset in a fresh process (imports
    done) to its first batch, worker start-up included;
  * whether that resume is exact: one process reads half the epoch, checkpoints, and reads the
    rest; a fresh process restores and reads the rest. Exact when the ids read before the
    checkpoint and after the restore are those of the uninterrupted epoch, none twice. The
    ids: the peers store one with each example; ours are ``with_index=True``'s indices, and
    ours through tf.data resumes in its exact-epoch mode (``ReadConfig(exclude=...)``), whose
    positions are the ids. A loader that repeats (tf.data) ends its epoch after ``n // 32``
    batches.
Every measurement runs in a fresh process; rounds interleave the rows and the median over
``--rounds`` is reported, with ratios against the best peer of each format (target for ours:
at most 0.75x the best peer's CPU per example). The peers run in their own venv
(``--peer_venv``, made from ``requirements-bench-torch.txt`` on first use), as MosaicML
Streaming needs numpy<2.2.

Usage::

  python -m benchmarks.bench_torch_loaders [--n 2000] [--rounds 3] [--work DIR]
      [--rows all|mosaic,litdata,wds,ours_torch,ours_tf] [--formats jpeg,raw] [--quick]
      [--json PATH] [--peer_venv DIR] [--no_resume]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import pickle
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SYSTEMS", "System", "main", "resume_verdict", "tree_cpu_seconds"]

REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "requirements-bench-torch.txt"
CONSTRAINTS = REPO / "constraints-bench-torch.txt"  # every package of the peers' venv, pinned
BATCH_SIZE = 32
IMAGE_SIZE = 224
SHARDS = 8  # per dataset, every system (torch_loader_peers.SHARDS)
FORMATS = ("jpeg", "raw")
# Our datasets under the photo cache, as ``benchmarks.common.photo_datasets`` names them.
OURS_DIR = {"jpeg": "jpeg256", "raw": "raw224"}
TARGET_CPU_RATIO = 0.75


@dataclasses.dataclass(frozen=True)
class System:
    """One loader the benchmark measures.

    Attributes:
      name: as the table shows it.
      peer: runs in the peers' venv (``torch_loader_peers``); otherwise in this one.
      resume: its resume API, or "none".
    """

    name: str
    peer: bool
    resume: str


SYSTEMS: dict[str, System] = {
    "mosaic": System(
        "MosaicML Streaming 0.13.0", True, "StreamingDataLoader.state_dict (num_samples)"
    ),
    "litdata": System("LitData 0.2.76", True, "StreamingDataLoader.state_dict"),
    "wds": System("webdataset 1.0.2", True, "none"),
    "ours_torch": System(
        "ours: tfrecord_io.torch + StatefulDataLoader", False, "StatefulDataLoader.state_dict"
    ),
    "ours_tf": System("ours: tf.data reader", False, "tf.train.Checkpoint(iterator)"),
}
PEERS = [k for k, s in SYSTEMS.items() if s.peer]


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process and all its descendants, each with the
    children it reaped: DataLoader workers, their threads and any helper processes."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            t = process.cpu_times()
        except psutil.NoSuchProcess:  # exited between the listing and the read
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def resume_verdict(
    before: Sequence[Any], after_reference: Sequence[Any], after_restored: Sequence[Any], n: int
) -> tuple[bool, str]:
    """Whether a resume was exact, and what it read.

    Args:
      before: the ids read before the checkpoint.
      after_reference: the ids the same loader read after it, uninterrupted.
      after_restored: the ids a fresh loader read after restoring the checkpoint.
      n: the examples in the dataset.

    Returns:
      ``(exact, detail)``: exact when ``before + after_restored`` is the uninterrupted epoch:
      every id it read, as many times, and nothing else (an id read twice is one too many).
      The detail also says when the uninterrupted epoch itself reads ids twice (ours fills
      its last step with the next epoch's first examples).
    """
    expected = collections.Counter(before) + collections.Counter(after_reference)
    got = collections.Counter(before) + collections.Counter(after_restored)
    missing = sum((expected - got).values())
    extra = sum((got - expected).values())
    parts = [f"{len(got)} of {n} ids"]
    if extra:
        parts.append(f"{extra} read twice or not in the epoch")
    if missing:
        parts.append(f"{missing} of the epoch's missing")
    repeats = sum(c - 1 for c in expected.values() if c > 1)
    if repeats:
        parts.append(f"the epoch itself reads {repeats} twice")
    return not (missing or extra), ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# The measuring processes (one per measurement; the peers' in the peers' venv).


@dataclasses.dataclass
class _Opened:
    """A loader started on its epoch, in a measuring process.

    Attributes:
      batches: ``(images, labels[, ids])`` batches.
      save: writes the loader's checkpoint under a directory; returns a picklable state.
      epoch_batches: where an epoch ends for a loader that repeats (ours); None when the
        loader ends the epoch itself.
      keep: objects kept alive with it (the loader, for its persistent workers).
    """

    batches: Iterator[Any]
    save: Callable[[Path], Any] | None
    epoch_batches: int | None
    keep: Any = None


def _open_peer(system: str, fmt: str, data: Path, state: Any) -> _Opened:
    from benchmarks.torch_loader_peers import open_peer

    peer = open_peer(system, fmt, data, state)
    save = peer.save
    return _Opened(peer.batches, None if save is None else lambda _: save(), None, peer)


def _open_ours_torch(fmt: str, data: Path, state: Any, n: int, with_ids: bool) -> _Opened:
    from torchdata.stateful_dataloader import StatefulDataLoader

    import tfrecord_io.torch as tt

    options: dict[str, Any] = {"with_index": True} if with_ids else {}
    dataset = tt.dataset(
        str(data),
        "train",
        global_batch_size=BATCH_SIZE,
        training=True,
        seed=0,
        image_size=IMAGE_SIZE,
        **options,
    )
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
    if state is not None:
        loader.load_state_dict(state)
    # Each pass of the loader is one epoch, which ends by itself.
    return _Opened(iter(loader), lambda _: loader.state_dict(), None, loader)


def _open_ours_tf(fmt: str, data: Path, state: Any, n: int, with_ids: bool) -> _Opened:
    import tensorflow as tf

    from tfrecord_io import DeliveredSet, ReadConfig, load_manifest, make_dataset

    config = None
    if with_ids:
        # Exact epochs: each element ends with its examples' positions, the ids compared.
        manifest = load_manifest(data)
        if manifest is None:
            raise ValueError(f"no dataset.json at {data}")
        examples = manifest.splits["train"].num_examples
        config = ReadConfig(exclude=DeliveredSet.empty(examples), num_epochs=1)
    dataset = make_dataset(
        data,
        "train",
        global_batch_size=BATCH_SIZE,
        seed=0,
        image_size=IMAGE_SIZE,
        read_config=config,
    )
    iterator = iter(dataset)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    if state is not None:
        checkpoint.read(state).assert_consumed()

    def save(directory: Path) -> str:
        return checkpoint.write(str(directory / "iterator"))

    return _Opened(iterator, save, n // BATCH_SIZE, dataset)


def _preload(system: str) -> None:
    """Imports what ``system``'s loader needs, so that a timing starts with the imports done."""
    modules = {
        "mosaic": ["streaming"],
        "litdata": ["litdata"],
        "wds": ["webdataset"],
        "ours_torch": ["torchdata.stateful_dataloader", "tfrecord_io.torch"],
        "ours_tf": ["tensorflow", "tfrecord_io.reader"],
    }[system]
    if SYSTEMS[system].peer:
        modules.append("benchmarks.torch_loader_peers")
    for module in modules:
        importlib.import_module(module)


def _open(
    system: str, fmt: str, data: Path, n: int, state: Any = None, ids: bool = False
) -> _Opened:
    if SYSTEMS[system].peer:
        return _open_peer(system, fmt, data, state)
    opener = _open_ours_torch if system == "ours_torch" else _open_ours_tf
    return opener(fmt, data, state, n, ids)


def _take(opened: _Opened, count: int | None, start: int = 0) -> Iterator[Any]:
    """Up to ``count`` more batches (None: to the end of the epoch); ``start`` already read."""
    limit = opened.epoch_batches
    done = start
    while (count is None or done - start < count) and (limit is None or done < limit):
        try:
            batch = next(opened.batches)
        except StopIteration:
            return
        done += 1
        yield batch


def _ids(batch: Any) -> list[int]:
    import numpy as np

    return [int(i) for i in np.asarray(batch[2]).reshape(-1)]


def _child_speed(args: argparse.Namespace) -> dict[str, Any]:
    """One epoch; the steady-state window's examples/s and tree CPU-ms per example."""
    opened = _open(args.system, args.format, Path(args.data), args.n)
    warmup, end = args.warmup_batches, args.n // BATCH_SIZE - args.tail_batches
    if end <= warmup:
        raise ValueError(f"--n {args.n} leaves no timed batches after {warmup} warm-up batches")
    for _ in _take(opened, warmup):
        pass
    cpu, wall = tree_cpu_seconds(), time.perf_counter()
    examples = timed = 0
    for batch in _take(opened, end - warmup, start=warmup):
        examples += len(batch[0])
        timed += 1
    wall, cpu = time.perf_counter() - wall, tree_cpu_seconds() - cpu
    if timed < end - warmup:
        raise RuntimeError(f"the epoch ended after {warmup + timed} batches, before {end}")
    rest = sum(1 for _ in _take(opened, None, start=end))
    return {
        "examples_per_s": examples / wall,
        "cpu_ms_per_example": 1000 * cpu / examples,
        "timed_examples": examples,
        "epoch_batches": end + rest,
    }


def _child_save(args: argparse.Namespace) -> dict[str, Any]:
    """Half an epoch, a checkpoint, then the rest of the epoch uninterrupted (the reference)."""
    state_dir = Path(args.state_dir)
    opened = _open(args.system, args.format, Path(args.data), args.n, ids=True)
    if opened.save is None:
        raise ValueError(f"{args.system} has no resume API")
    half = args.n // BATCH_SIZE // 2
    before = [i for batch in _take(opened, half) for i in _ids(batch)]
    state = opened.save(state_dir)
    (state_dir / "state.pkl").write_bytes(pickle.dumps(state))
    after = [i for batch in _take(opened, None, start=half) for i in _ids(batch)]
    (state_dir / "saved.json").write_text(json.dumps({"before": before, "after": after}))
    return {"before": len(before), "after": len(after)}


def _child_restore(args: argparse.Namespace) -> dict[str, Any]:
    """Restores the checkpoint in this fresh process; times its first batch, reads the rest."""
    state_dir = Path(args.state_dir)
    state = pickle.loads((state_dir / "state.pkl").read_bytes())
    _preload(args.system)
    start = time.perf_counter()
    opened = _open(args.system, args.format, Path(args.data), args.n, state, ids=True)
    half = args.n // BATCH_SIZE // 2
    batches = _take(opened, None, start=half)
    first = next(batches, None)
    first_batch_s = time.perf_counter() - start
    after = [] if first is None else _ids(first)
    after += [i for batch in batches for i in _ids(batch)]
    (state_dir / "restored.json").write_text(json.dumps({"after": after}))
    return {"first_batch_s": first_batch_s, "after": len(after)}


def _child_write(args: argparse.Namespace) -> dict[str, Any]:
    """Writes a peer's dataset from the source list the parent made."""
    from benchmarks.torch_loader_peers import write_peer

    examples = pickle.loads(Path(args.source).read_bytes())
    write_peer(args.system, args.format, examples, Path(args.data))
    return {"written": len(examples)}


def _child_main(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    jobs = {
        "speed": _child_speed,
        "save": _child_save,
        "restore": _child_restore,
        "write": _child_write,
    }
    result = jobs[args.child](args)
    print(json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The parent: inputs, the peers' venv, the rounds and the table.


def ensure_peer_venv(venv: Path) -> Path:
    """Makes ``venv`` with ``requirements-bench-torch.txt``'s pins, once; returns its python.

    As ``scripts/bootstrap.sh`` makes ``.venv``: pinned pip, setuptools and uv, then uv
    installs the list under ``constraints-bench-torch.txt`` (again when either changes).

    Raises:
      RuntimeError: naming the step, if an install failed.
    """
    python = venv / "bin" / "python"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes() + CONSTRAINTS.read_bytes()).hexdigest()[:16]
    stamp = venv / f".installed-{digest}"
    if stamp.exists():
        return python
    print(f"Installing {REQUIREMENTS.name} into {venv} (first run: a few minutes)...", flush=True)
    env = dict(os.environ)
    if env.get("PIP_FIND_LINKS") and not env.get("UV_FIND_LINKS"):
        env["UV_FIND_LINKS"] = env["PIP_FIND_LINKS"]
    steps = []
    if not python.exists():
        steps.append([sys.executable, "-m", "venv", str(venv)])
    steps += [
        [str(python), "-m", "pip", "install", "--quiet", "pip==26.3", "setuptools==80.9.0"]
        + ["uv==0.13.9"],
        [str(venv / "bin" / "uv"), "pip", "install", "--python", str(python), "--native-tls"]
        + ["--quiet", "-r", str(REQUIREMENTS), "-c", str(CONSTRAINTS)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(step)} failed:\n{done.stderr[-4000:]}")
    for old in venv.glob(".installed-*"):
        old.unlink()
    stamp.write_text("")
    return python


def _run_child(python: Path | str, flags: Sequence[str], timeout: float) -> dict[str, Any]:
    """``python -m benchmarks.bench_torch_loaders --child ...`` in a fresh process (its own
    process group, ended whole on a time-out); returns its JSON line.

    Raises:
      RuntimeError: with the end of its stderr, if it failed or timed out.
    """
    command = [str(python), "-m", "benchmarks.bench_torch_loaders", *flags]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        # LitData asks PyPI for a newer version whenever a dataset is made: not in a timing.
        "LITDATA_DISABLE_VERSION_CHECK": "1",
    }
    child = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        os.killpg(child.pid, signal.SIGKILL)
        _, err = child.communicate()
        raise RuntimeError(
            f"{' '.join(flags)}: timed out after {timeout:.0f} s\n{err[-2000:]}"
        ) from e
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(flags)} failed ({child.returncode}):\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _peer_source(root: Path, photos: Sequence[Path], fmt: str) -> Path:
    """The peers' ``(id, label, payload)`` list of one format, made once per photo set with the
    pipeline's own image step (256 px JPEG q90, or the RAW 224 centre crop's pixels); returns
    the pickle it is in. The id is the photo's index in ``photos``."""
    from beam_pipelines.image.options import ImageOptions
    from beam_pipelines.image.prepare import prepare_image

    path = root / f"source-{fmt}.pkl"
    if path.exists():
        return path
    options = {
        "jpeg": ImageOptions(image_size=256),
        "raw": ImageOptions(image_size=IMAGE_SIZE, crop="center", encoding="raw"),
    }[fmt]
    classes = sorted({p.parent.name for p in photos})
    examples = []
    for sample_id, photo in enumerate(photos):
        prepared = prepare_image(photo.read_bytes(), options)
        examples.append((sample_id, classes.index(photo.parent.name), prepared.encoded))
    # In a fixed random order, as our pipeline spreads examples over shards by their hashes:
    # the peers shuffle shards and within shards, and class-sorted shards would give batches
    # of one class.
    random.Random(0).shuffle(examples)
    root.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")
    partial.write_bytes(pickle.dumps(examples))
    partial.rename(path)
    return path


def _prepare(args: argparse.Namespace, systems: Sequence[str], peer_python: Path | None):
    """Photos, our datasets and the peers' (each written once under ``--work``); returns
    ``(data directory per (system, format), photos)``."""
    from benchmarks.common import photo_datasets

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with photo_datasets(args.n, shards=SHARDS, cache=str(work)) as made:
        root, photos = made.root, made.photos
    data: dict[tuple[str, str], Path] = {}
    for system in systems:
        for fmt in args.formats:
            data[system, fmt] = root / OURS_DIR[fmt]
            if not SYSTEMS[system].peer:
                continue
            assert peer_python is not None
            out = data[system, fmt] = root / "peers" / f"{system}-{fmt}"
            if (out / "complete").exists():
                continue
            source = _peer_source(root / "peers", photos, fmt)
            shutil.rmtree(out, ignore_errors=True)
            flags = ["--child", "write", "--system", system, "--format", fmt]
            flags += ["--data", str(out), "--source", str(source)]
            _run_child(peer_python, flags, args.timeout)
            (out / "complete").write_text("")
    print(
        f"{args.n} photos ({made.mean_kb:.0f} KB mean), datasets under {root} "
        f"(prepared in {time.perf_counter() - start:.0f} s)",
        flush=True,
    )
    return data, photos


def _measure(
    args: argparse.Namespace, system: str, fmt: str, data: Path, python: Path | str, run: int
) -> dict[str, Any]:
    """One round of one row: the speed process, then (with a resume API) the save and
    restore processes. Returns the figures."""
    common = ["--system", system, "--format", fmt, "--data", str(data), "--n", str(args.n)]
    speed = ["--warmup_batches", str(args.warmup_batches)]
    speed += ["--tail_batches", str(args.tail_batches)]
    result = _run_child(python, ["--child", "speed", *common, *speed], args.timeout)
    if args.no_resume or SYSTEMS[system].resume == "none":
        return result
    state_dir = Path(args.work) / "resume" / f"{system}-{fmt}-{run}"
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True)
    try:
        flags = [*common, "--state_dir", str(state_dir)]
        _run_child(python, ["--child", "save", *flags], args.timeout)
        restored = _run_child(python, ["--child", "restore", *flags], args.timeout)
        saved = json.loads((state_dir / "saved.json").read_text())
        after = json.loads((state_dir / "restored.json").read_text())["after"]
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    exact, detail = resume_verdict(saved["before"], saved["after"], after, args.n)
    return {
        **result,
        "first_batch_s": restored["first_batch_s"],
        "exact": exact,
        "exact_detail": detail,
    }


def _skip_reason(system: str) -> str | None:
    """Why a row of ours cannot run in this venv, or None."""
    if system == "ours_torch":
        for module in ("torch", "torchdata"):
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed in this venv"
        spec = importlib.util.find_spec("tfrecord_io.torch")
        if spec is None or spec.origin is None:  # absent, or a folder without __init__.py yet
            return "tfrecord_io.torch is not there yet (needs tfrecord_io/torch/__init__.py)"
    return None


def _median_row(system: str, fmt: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rounds if "error" not in r]
    row: dict[str, Any] = {
        "system": system,
        "name": SYSTEMS[system].name,
        "format": fmt,
        "resume_api": SYSTEMS[system].resume,
        "rounds": rounds,
    }
    if not ok:
        row["error"] = rounds[0].get("error", "no rounds") if rounds else "no rounds"
        return row
    row["examples_per_s"] = statistics.median(r["examples_per_s"] for r in ok)
    row["cpu_ms_per_example"] = statistics.median(r["cpu_ms_per_example"] for r in ok)
    resumed = [r for r in ok if "first_batch_s" in r]
    if resumed:
        row["first_batch_s"] = statistics.median(r["first_batch_s"] for r in resumed)
        row["resume_exact"] = all(r["exact"] for r in resumed)
        row["resume_detail"] = next(
            (r["exact_detail"] for r in resumed if not r["exact"]), resumed[0]["exact_detail"]
        )
    return row


def _paired(row: dict[str, Any], best: dict[str, Any], key: str) -> float:
    """The median over rounds of ``row / best`` for ``key``, each round's pair side by side
    (rounds interleave the rows, so a pair saw the same state of the shared machine)."""
    pairs = zip(row["rounds"], best["rounds"], strict=False)
    ratios = [a[key] / b[key] for a, b in pairs if "error" not in a and "error" not in b]
    return statistics.median(ratios) if ratios else row[key] / best[key]


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """Adds each row's CPU and examples/s ratios against its format's best peer."""
    for fmt in FORMATS:
        peers = [
            r for r in rows if r["format"] == fmt and r["system"] in PEERS and "error" not in r
        ]
        if not peers:
            continue
        cheapest = min(peers, key=lambda r: r["cpu_ms_per_example"])
        fastest = max(peers, key=lambda r: r["examples_per_s"])
        for row in rows:
            if row["format"] == fmt and "error" not in row:
                row["cpu_vs_best_peer"] = _paired(row, cheapest, "cpu_ms_per_example")
                row["cpu_best_peer"] = cheapest["system"]
                row["rate_vs_best_peer"] = _paired(row, fastest, "examples_per_s")
                row["rate_best_peer"] = fastest["system"]


def _print_table(rows: list[dict[str, Any]]) -> list[str]:
    """Prints the table; returns the targets ours missed."""
    missed = []
    print(
        "| system | format | examples/s | CPU-ms/ex | CPU/ex vs best peer | ex/s vs best peer "
        "| resume API | first batch after resume | resume exact |"
    )
    print("|---|---|---:|---:|---:|---:|---|---:|---|")
    for row in rows:
        head = f"| {row['name']} | {row['format'].upper()} |"
        if "error" in row:
            print(f"{head} {row['error'].splitlines()[-1][:120]} |||||||")
            continue
        cpu_ratio = row.get("cpu_vs_best_peer")
        verdict = ""
        if cpu_ratio is not None and not SYSTEMS[row["system"]].peer:
            ok = cpu_ratio <= TARGET_CPU_RATIO
            verdict = " (met)" if ok else " (NOT met)"
            if not ok:
                missed.append(f"{row['name']} {row['format'].upper()}: CPU {cpu_ratio:.2f}x")
        # "none": the system has no resume API; "-": not measured (--no_resume).
        absent = "none" if row["resume_api"] == "none" else "-"
        exact, first = absent, absent
        if "resume_exact" in row:
            exact = f"{'yes' if row['resume_exact'] else 'NO'} ({row['resume_detail']})"
            first = f"{row['first_batch_s']:.2f} s"
        print(
            f"{head} {row['examples_per_s']:,.0f} | {row['cpu_ms_per_example']:.3f} | "
            f"{_ratio(cpu_ratio, row.get('cpu_best_peer'))}{verdict} | "
            f"{_ratio(row.get('rate_vs_best_peer'), row.get('rate_best_peer'))} | "
            f"{row['resume_api']} | {first} | {exact} |"
        )
    return missed


def _ratio(value: float | None, against: str | None) -> str:
    return "-" if value is None else f"{value:.2f}x {against}"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="photos (2000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument(
        "--rows", default="all", help=f"'all' or names from {list(SYSTEMS)}, comma-separated"
    )
    parser.add_argument("--formats", default="jpeg,raw", help="jpeg, raw or both (jpeg,raw)")
    parser.add_argument("--warmup_batches", type=int, default=8, help="discarded first (8)")
    parser.add_argument("--tail_batches", type=int, default=4, help="left out at the end (4)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 256 photos, 1 round")
    parser.add_argument(
        "--work",
        default=str(Path(tempfile.gettempdir()) / "bench_torch_loaders"),
        help="photos and datasets, kept for reruns (a temporary-directory folder)",
    )
    parser.add_argument(
        "--peer_venv", default=str(REPO / ".venv-peers"), help="the peers' venv (.venv-peers)"
    )
    parser.add_argument("--no_resume", action="store_true", help="skip the resume measurements")
    parser.add_argument("--timeout", type=float, default=900.0, help="per process (900 s)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    # A measuring process (see _run_child).
    for hidden in ("--child", "--system", "--format", "--data", "--state_dir", "--source"):
        parser.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return args
    if args.quick:
        args.n, args.rounds, args.warmup_batches, args.tail_batches = 256, 1, 2, 1
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not args.formats or any(f not in FORMATS for f in args.formats):
        parser.error(f"--formats: choose from {list(FORMATS)}, comma-separated")
    names = list(SYSTEMS) if args.rows == "all" else [r.strip() for r in args.rows.split(",")]
    if not names or any(r not in SYSTEMS for r in names):
        parser.error(f"--rows {args.rows!r}: choose 'all' or names from {list(SYSTEMS)}")
    args.rows = names
    if args.n // BATCH_SIZE - args.tail_batches <= args.warmup_batches or args.rounds < 1:
        parser.error("--n too small for the warm-up and tail batches, or --rounds below 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.child is not None:
        return _child_main(args)
    systems = []
    for system in args.rows:
        reason = _skip_reason(system)
        if reason:
            print(f"skipping {SYSTEMS[system].name}: {reason}", flush=True)
        else:
            systems.append(system)
    needs_peers = any(SYSTEMS[s].peer for s in systems)
    peer_python = ensure_peer_venv(Path(args.peer_venv)) if needs_peers else None
    data, _ = _prepare(args, systems, peer_python)
    loads = [os.getloadavg()[0]]
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in range(args.rounds):
        for fmt in args.formats:
            for system in systems:
                python = peer_python if SYSTEMS[system].peer else sys.executable
                assert python is not None
                try:
                    value = _measure(args, system, fmt, data[system, fmt], python, run)
                except RuntimeError as e:
                    value = {"error": str(e)}
                samples.setdefault((system, fmt), []).append(value)
                _progress(system, fmt, value)
            loads.append(os.getloadavg()[0])
    rows = [_median_row(s, f, samples[s, f]) for f in args.formats for s in systems]
    _add_ratios(rows)
    conditions = (
        f"{args.n} ImageNet-like photos, batch {BATCH_SIZE}, 2 loader workers, one epoch "
        f"less {args.warmup_batches} warm-up and {args.tail_batches} tail batches; "
        f"{args.rounds} interleaved rounds, a process per measurement, medians; "
        f"{os.cpu_count()} CPUs, load average {min(loads):.1f}-{max(loads):.1f} (1-min)"
    )
    print(conditions)
    print()
    missed = _print_table(rows)
    if any(not SYSTEMS[s].peer for s in systems) and any(SYSTEMS[s].peer for s in systems):
        print("ours: target met" if not missed else "NOT met: " + "; ".join(missed))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"conditions": conditions, "rows": rows}, indent=2) + "\n"
        )
    return 1 if any("error" in r for r in rows) else 0


def _progress(system: str, fmt: str, value: dict[str, Any]) -> None:
    name = f"  {SYSTEMS[system].name}, {fmt.upper()}:"
    if "error" in value:
        print(f"{name} FAILED: {value['error']}", flush=True)
        return
    line = (
        f"{name} {value['examples_per_s']:,.0f} ex/s, {value['cpu_ms_per_example']:.3f} CPU-ms/ex"
    )
    if "first_batch_s" in value:
        exact = "exact" if value["exact"] else "NOT exact"
        line += f"; resume: first batch {value['first_batch_s']:.2f} s, {exact}"
        line += f" ({value['exact_detail']})"
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())

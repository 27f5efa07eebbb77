"""What the reader, trainer and service benchmarks share: the baseline and the shard writer.

* ``tuned_jpeg_dataset``: the usual well-tuned tf.data pipeline over the original JPEG files
  (parallel decode and resize, AUTOTUNE, prefetch), the baseline every reading benchmark
  compares against: it is how training is fed when there are no prepared shards.
* ``write_shards``: runs the project's pipeline (``python -m beam_pipelines.images_to_tfrecord``,
  two worker processes) over a photo folder, as a user would, and checks it published.
* ``run_module``: ``python -m MODULE ...`` in a fresh process, failing with its stderr; the
  benchmarks measure in fresh processes, as users run pipelines and trainers.
* ``photo_datasets``: the set-up the reader, service and trainer benchmarks share: ImageNet-like
  photos in a temporary directory, written as JPEG-256 (and RAW-224) datasets.
* ``publish_synthetic_manifest``: ``dataset.json`` (and its shard tables) for the synthetic
  8-pixel PNG datasets of the manifest and verify benchmarks, written as the pipeline
  publishes them.
* ``exit_on_sigterm``: a benchmark that starts local clusters stops them when it is sent
  SIGTERM, as it does on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from schemas import MANIFEST_NAME, Counts, ImageSpec, Manifest, SplitInfo
from schemas.shard_table import encode_manifest

__all__ = [
    "JPEG_256",
    "RAW_224",
    "PhotoDatasets",
    "tuned_jpeg_dataset",
    "photo_datasets",
    "publish_synthetic_manifest",
    "exit_on_sigterm",
    "run_module",
    "write_shards",
]

# The two datasets the reading benchmarks compare, as ``write_shards`` flags.
JPEG_256 = ("--image_size", "256")
RAW_224 = ("--image_size", "224", "--crop", "center", "--encoding", "raw")


def tuned_jpeg_dataset(photos: Path, batch_size: int, image_size: int = 224, seed: int = 0) -> Any:
    """The usual tuned tf.data pipeline over the original JPEGs, labelled by class folder.

    list files -> shuffle -> parallel map(read_file, decode_jpeg, resize, normalise) -> batch ->
    prefetch, with AUTOTUNE at every step that takes it. Returns a ``tf.data.Dataset`` of
    ``(float32 [B, S, S, 3], int32 [B])``, repeating forever.
    """
    import tensorflow as tf

    # The reader's own statistics: the baseline's float32 output means what the reader's does.
    from tfrecord_io.decode import MEAN_RGB, STDDEV_RGB

    paths = sorted(str(p) for p in photos.glob("*/*") if p.is_file())
    classes = sorted({Path(p).parent.name for p in paths})
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(classes), tf.range(len(classes), dtype=tf.int32)
        ),
        default_value=-1,
    )
    mean = tf.constant(MEAN_RGB, tf.float32)
    std = tf.constant(STDDEV_RGB, tf.float32)

    def load(path: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        image = tf.image.resize(image, [image_size, image_size])
        label = table.lookup(tf.strings.split(path, os.sep)[-2])
        return (image - mean) / std, label

    ds = tf.data.Dataset.from_tensor_slices(paths)
    ds = ds.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def exit_on_sigterm() -> None:
    """From now on SIGTERM ends this process as Ctrl-C does: ``SystemExit`` (status 143) is
    raised in the main thread, so the ``with`` blocks on the way out run, among them those
    that started a local Flink or Spark cluster (``local_clusters``), which stop it. Without
    this, Python dies on SIGTERM at once and the cluster's JVMs keep running. Call it from the
    main thread."""

    def _exit(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def run_module(module: str, args: Sequence[str], env: dict[str, str] | None = None) -> str:
    """Runs ``python -m module *args`` in a fresh process; returns its stdout.

    Raises:
      RuntimeError: naming the command, with the end of its stderr, if it exited non-zero.
    """
    command = [sys.executable, "-m", module, *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}"
        )
    return done.stdout


def write_shards(photos: Path, output: Path, num_shards: int, extra: Sequence[str] = ()) -> None:
    """Writes ``photos`` as a dataset at ``output`` with the project's pipeline.

    Args:
      photos: a ``<class name>/<image file>`` folder.
      output: the dataset directory to create.
      num_shards: train shards.
      extra: more pipeline flags, e.g. ``["--image_size", "224", "--encoding", "raw"]``.

    Raises:
      RuntimeError: with the end of the pipeline's stderr, if it failed or did not publish.
    """
    args = [
        "--input",
        str(photos),
        "--output",
        str(output),
        "--num_shards",
        str(num_shards),
        "--max_bad_fraction",
        "0",
        "--direct_num_workers=2",
        "--direct_running_mode=multi_processing",
        *extra,
    ]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    run_module("beam_pipelines.images_to_tfrecord", args, env)
    if not (output / "dataset.json").exists():
        raise RuntimeError(f"the pipeline did not publish a dataset at {output}")


@dataclasses.dataclass(frozen=True)
class PhotoDatasets:
    """What ``photo_datasets`` made.

    Attributes:
      root: the temporary directory: ``photos/``, ``jpeg256/`` and (with ``raw``) ``raw224/``.
      photos: the photo files.
      mean_kb: their mean size in KiB.
      shards: train shards of each dataset.
      prepare_s: seconds the pipeline runs took.
    """

    root: Path
    photos: list[Path]
    mean_kb: float
    shards: int
    prepare_s: float


@contextlib.contextmanager
def photo_datasets(
    n: int,
    *,
    shards: int,
    workdir: str | None = None,
    raw: bool = True,
    family: str = "imagenet_like",
    cache: str | None = None,
) -> Iterator[PhotoDatasets]:
    """``n`` photos written as benchmark datasets, in a directory removed after.

    Args:
      n: photos to generate (seed 0, so every benchmark sees the same ones).
      shards: train shards of each dataset.
      workdir: where the temporary directory goes (the system default when None).
      raw: also write the RAW-224 dataset.
      family: the kind of photo (``benchmarks.photo_families.FAMILIES``); the default is the
        ImageNet-like photos the README's figures were measured on.
      cache: keep the datasets in ``cache/<family>-<n>-<shards>`` and reuse them on later
        runs (they are deterministic), instead of a temporary directory.
    """
    from benchmarks.photo_families import write_family

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with contextlib.ExitStack() as stack:
        if cache is not None:
            root = Path(cache) / f"{family}-{n}-{shards}{'' if raw else '-jpeg'}"
            done = root / "complete"
            if done.exists():
                photos = sorted(p for p in (root / "photos").rglob("*") if p.is_file())
                mean_kb = sum(p.stat().st_size for p in photos) / len(photos) / 1024
                yield PhotoDatasets(root, photos, mean_kb, shards, 0.0)
                return
            shutil.rmtree(root, ignore_errors=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=workdir)))
        photos = write_family(family, root / "photos", n, seed=0)
        mean_kb = sum(p.stat().st_size for p in photos) / len(photos) / 1024
        start = time.perf_counter()
        write_shards(root / "photos", root / "jpeg256", shards, JPEG_256)
        if raw:
            write_shards(root / "photos", root / "raw224", shards, RAW_224)
        if cache is not None:
            (root / "complete").write_text("")
        yield PhotoDatasets(root, photos, mean_kb, shards, time.perf_counter() - start)


def parse_batch_sizes(text: str, default: str) -> list[int]:
    """``--batch_size``'s comma-separated positive ints; ``default`` is named in the error."""
    try:
        sizes = [int(v) for v in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) <= 0:
        raise SystemExit(f"--batch_size {text!r}: give positive ints, comma-separated ({default})")
    return sizes


def parse_rows(text: str, keys: dict[str, str], every: Sequence[str]) -> list[str]:
    """``--rows``: ``'all'`` gives ``every``; otherwise short names, comma-separated, looked up
    in ``keys`` (short name -> row name)."""
    if text == "all":
        return list(every)
    chosen = [k.strip() for k in text.split(",") if k.strip()]
    if not chosen or any(k not in keys for k in chosen):
        raise SystemExit(f"--rows {text!r}: choose 'all' or names from {list(keys)}")
    return [keys[k] for k in chosen]


def publish_synthetic_manifest(
    root: Path,
    splits: Mapping[str, SplitInfo],
    label_names: Sequence[str],
    *,
    shard_root: str | None = None,
    format_version: int | None = None,
) -> Manifest:
    """Writes the ``dataset.json`` of a synthetic 8-pixel PNG dataset whose every input was
    written, with an empty ``rejected.jsonl``: its shard tables first and ``dataset.json``
    last, as the pipeline publishes them.

    Args:
      root: the dataset directory (exists).
      splits: the splits, with their shard entries.
      label_names: the class names.
      shard_root: where the shards are, when not in ``root``.
      format_version: 1 for the inline layout (every shard entry in ``dataset.json``); None
        for the current one.

    Returns:
      The manifest written.
    """
    total = sum(split.num_examples for split in splits.values())
    manifest = Manifest(
        label_names=tuple(label_names),
        splits=dict(splits),
        counts=Counts(input=total, written=total, rejected=0, duplicates=0),
        image=ImageSpec(encoding="png", image_size=8, crop="none"),
        options={"image_size": 8, "encoding": "png", "crop": "none"},
        shard_root=shard_root,
    )
    if format_version is not None:
        manifest = manifest.with_format(format_version)
    (root / manifest.rejected_file).write_text("")
    text, tables = encode_manifest(manifest)
    for name, data in tables.items():
        (root / name).write_bytes(data)
    (root / MANIFEST_NAME).write_text(text)
    return manifest

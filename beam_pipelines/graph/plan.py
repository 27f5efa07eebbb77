"""The shard plan: how many shards each split gets, fixed before any record is placed, and
saved to ``DST/.staging/plan.json`` before any shard is written.

Two rules, both known before any image is decoded, so no record waits for the others:

* ``--num_shards N``: ``train`` gets N shards, ``validation`` ``ceil(N·f/(1−f))``
  (``shards.fixed_shard_counts``). The launcher writes ``plan.json`` before the pipeline runs.
* default: N is planned from the listing. ``N = ceil(inputs · (1−f) · b / T)`` (at least 1,
  at most ``MAX_SHARDS``), where ``inputs`` counts every listed file, ``T`` is ``--target_shard_mb``
  and ``b`` the stored bytes per example the image options determine
  (``estimated_example_bytes``); then as ``--num_shards N``. A pipeline step counts the
  listing, writes ``plan.json`` and hands the counts to the shard assignment as a side input:
  records wait only for the listing, which is done before decoding starts anyway.

The estimate is exact for ``raw`` and a rule of thumb for ``jpeg`` and ``png`` (whose size
depends on the pixels), so byte-planned shards come out within about 2x of the target.

``plan.json`` also records a fingerprint of the options that shape the dataset: ``--resume``
refuses to continue a build made with other options, naming them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipelines.engines.filesystems import write_object
from beam_pipelines.image.prepare import ImageOptions
from beam_pipelines.output.catalog_io import STAGING_DIR
from beam_pipelines.output.shards import fixed_shard_counts
from schemas.constants import MAX_SHARDS

__all__ = [
    "PLAN_NAME",
    "PLAN_FORMAT",
    "EXAMPLE_OVERHEAD_BYTES",
    "estimated_example_bytes",
    "listing_shard_counts",
    "content_options",
    "options_fingerprint",
    "plan_path",
    "make_plan",
    "write_plan",
    "read_plan",
    "check_plan",
    "PlanShards",
]

PLAN_NAME = "plan.json"
PLAN_FORMAT = 1
# Feature keys, label text, file name, key and the TFRecord frame, roughly, per example.
EXAMPLE_OVERHEAD_BYTES = 400
# Recorded in dataset.json but without effect on what a shard holds: a resumed build may
# change them (a build refused for its bad fraction is resumed with a higher limit).
_NOT_CONTENT = frozenset({"max_bad_fraction"})


def estimated_example_bytes(image: ImageOptions) -> int:
    """The stored bytes per example the image options imply.

    Pixels: ``s²`` with a center crop, else ``s × 4s/3`` (a 4:3 photo) for ``image_size`` s.
    Bytes per pixel: ``raw`` 3 (exact); ``png`` 2; ``jpeg`` ``0.25 + 0.75·(q/100)³`` for
    quality q (0.80 at q90, about what photos take). Plus ``EXAMPLE_OVERHEAD_BYTES``.
    """
    side = image.image_size
    pixels = side * side if image.crop == "center" else side * math.ceil(side * 4 / 3)
    if image.encoding == "raw":
        per_pixel = 3.0
    elif image.encoding == "png":
        per_pixel = 2.0
    else:
        per_pixel = 0.25 + 0.75 * (image.jpeg_quality / 100) ** 3
    return int(pixels * per_pixel) + EXAMPLE_OVERHEAD_BYTES


def listing_shard_counts(
    num_inputs: int,
    *,
    example_bytes: int,
    validation_fraction: float,
    target_shard_bytes: int,
) -> dict[str, int]:
    """Shard counts planned from the listing (the module docstring's default rule).

    Raises:
      ValueError: for a negative ``num_inputs`` or non-positive sizes.
    """
    if num_inputs < 0 or example_bytes < 1 or target_shard_bytes < 1:
        raise ValueError(
            f"num_inputs ({num_inputs}) must be >= 0, example_bytes ({example_bytes}) and "
            f"target_shard_bytes ({target_shard_bytes}) >= 1"
        )
    train_bytes = num_inputs * (1.0 - validation_fraction) * example_bytes
    train_shards = min(MAX_SHARDS, max(1, math.ceil(train_bytes / target_shard_bytes)))
    return fixed_shard_counts(train_shards, validation_fraction)


def content_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options (as recorded in ``dataset.json``) that shape what the shards hold."""
    return {k: v for k, v in sorted(options.items()) if k not in _NOT_CONTENT}


def options_fingerprint(options: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of ``content_options(options)`` as canonical JSON."""
    text = json.dumps(content_options(options), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def plan_path(output_dir: str) -> str:
    """``DST/.staging/plan.json``."""
    return FileSystems.join(output_dir, STAGING_DIR, PLAN_NAME)


def make_plan(
    counts: Mapping[str, int],
    *,
    options: Mapping[str, Any],
    rule: str,
    num_inputs: int | None = None,
    example_bytes: int | None = None,
) -> dict[str, Any]:
    """The content of ``plan.json``."""
    return {
        "format": PLAN_FORMAT,
        "shard_counts": dict(sorted(counts.items())),
        "rule": rule,
        "inputs": num_inputs,
        "example_bytes": example_bytes,
        "fingerprint": options_fingerprint(options),
        "options": content_options(options),
    }


def write_plan(output_dir: str, plan: Mapping[str, Any]) -> None:
    """Writes ``plan.json`` (temporary name, then rename)."""
    text = json.dumps(plan, sort_keys=True, ensure_ascii=False, indent=1, default=str)
    write_object(plan_path(output_dir), text.encode("utf-8"))


def read_plan(output_dir: str) -> dict[str, Any] | None:
    """The saved plan, or None when there is none.

    Raises:
      ValueError: if ``plan.json`` exists but is not a plan.
    """
    path = plan_path(output_dir)
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        text = handle.read().decode("utf-8")
    try:
        plan = json.loads(text)
        counts = {str(k): int(v) for k, v in plan["shard_counts"].items()}
        if plan["format"] != PLAN_FORMAT or not all(v >= 1 for v in counts.values()):
            raise ValueError(f"format {plan['format']!r}, shard counts {counts!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not a shard plan of format {PLAN_FORMAT}: {e}") from e
    plan["shard_counts"] = counts
    return plan


def check_plan(plan: Mapping[str, Any], options: Mapping[str, Any], *, path: str) -> None:
    """Checks that a saved plan was made with the same content options as this build.

    Raises:
      ValueError: naming each option that differs and its two values.
    """
    if plan.get("fingerprint") == options_fingerprint(options):
        return
    saved = plan.get("options") or {}
    now = content_options(options)
    changes = [
        f"{key} {saved.get(key)!r} -> {now.get(key)!r}"
        for key in sorted(set(saved) | set(now))
        if saved.get(key) != now.get(key)
    ]
    raise ValueError(
        f"--resume: the interrupted build in {path} used other options ("
        + (", ".join(changes) or "a different fingerprint")
        + "); rerun it with its own options, or without --resume to start over"
    )


class _WritePlanFn(beam.DoFn):
    def __init__(self, output_dir: str, plan_args: dict[str, Any]) -> None:
        self._output_dir = output_dir
        self._plan_args = plan_args

    def process(self, num_inputs: int):
        args = self._plan_args
        counts = listing_shard_counts(
            num_inputs,
            example_bytes=args["example_bytes"],
            validation_fraction=args["validation_fraction"],
            target_shard_bytes=args["target_shard_bytes"],
        )
        plan = make_plan(
            counts,
            options=args["options"],
            rule="listing",
            num_inputs=num_inputs,
            example_bytes=args["example_bytes"],
        )
        # Before the counts leave this step, so before any shard can be written.
        write_plan(self._output_dir, plan)
        yield counts


class PlanShards(beam.PTransform):
    """``SourceFile -> {split: num_shards}`` (one element), with ``plan.json`` written.

    Args:
      output_dir: the dataset directory.
      counts: fixed counts (from ``--num_shards`` or a resumed plan, already saved by the
        launcher), or None to plan them from the listing.
      image, validation_fraction, target_shard_bytes: the listing rule's inputs.
      options: the options recorded in ``dataset.json`` (for the fingerprint).
    """

    def __init__(
        self,
        output_dir: str,
        *,
        counts: Mapping[str, int] | None,
        image: ImageOptions,
        validation_fraction: float,
        target_shard_bytes: int,
        options: Mapping[str, Any],
    ) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._counts = dict(counts) if counts is not None else None
        self._plan_args = {
            "example_bytes": estimated_example_bytes(image),
            "validation_fraction": validation_fraction,
            "target_shard_bytes": target_shard_bytes,
            "options": dict(options),
        }

    def expand(self, sources):
        if self._counts is not None:
            return sources.pipeline | "FixedCounts" >> beam.Create([self._counts])
        return (
            sources
            | "CountInputs" >> beam.combiners.Count.Globally()
            # int, one element
            | "WritePlan" >> beam.ParDo(_WritePlanFn(self._output_dir, self._plan_args))
            # {split: num_shards}, one element
        )

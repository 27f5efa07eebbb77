"""The pipeline's own configuration, validated once, independent of the Beam runner."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import PIL
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipelines.graph.leakage import LEAKAGE_ACTIONS
from beam_pipelines.image.colour import HIGH_BIT_DEPTH_POLICIES
from beam_pipelines.image.formats import parse_accepted_formats
from beam_pipelines.image.prepare import ImageOptions
from beam_pipelines.output.shards import LABEL_CONFLICT_POLICIES
from catalog.near_duplicates import DEFAULT_THRESHOLD, MAX_THRESHOLD
from schemas.constants import CROPS, ENCODINGS, MAX_SHARDS

__all__ = ["PipelineConfig", "ImagesToTFRecordOptions", "config_from_options", "parse_background"]

_HEX_COLOUR = re.compile(r"^#?([0-9a-fA-F]{6})$")


def parse_background(text: str) -> tuple[int, int, int]:
    """Parses ``#rrggbb`` (or ``rrggbb``) into an RGB tuple.

    Raises:
      ValueError: naming the text and the expected form.
    """
    match = _HEX_COLOUR.match(text.strip())
    if not match:
        raise ValueError(f"background colour must look like '#ffffff', got {text!r}")
    value = match.group(1)
    return (int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16))


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """Everything the images -> TFRecord pipeline needs besides the runner.

    Attributes:
      input: a directory/prefix laid out as ``<class>/<file>``, or a ``.csv``/``.jsonl`` listing.
      output: the dataset directory/prefix; ``dataset.json`` is written there last.
      image: how each image is prepared.
      validation_fraction: share of examples (by content hash) put in the ``validation`` split.
      num_shards: shard count for ``train``, fixed before the run (validation gets
        ``ceil(num_shards * f / (1 - f))`` for ``validation_fraction`` f); None to plan counts
        from the prepared bytes and ``target_shard_mb``, which costs a wait for all records.
      target_shard_mb: wanted shard size in MiB when ``num_shards`` is None.
      max_bad_fraction: largest bad fraction that still publishes the dataset: inputs rejected
        for any reason but ``no_label``, over inputs inside a class (see ``StagedResult``).
      overwrite: replace an existing dataset at ``output``.
      resume: continue the build that ``DST/.staging/`` holds (``resume``): complete shards are
        kept and staged examples reused, for a byte-identical result.
      staging_file_mb: the image step commits its staging file (and hands its examples on)
        once it holds this many MiB, or 10 s after its first example (``staging``): smaller
        loses less work to a kill, larger makes fewer objects.
      label_conflicts: what to do with byte-identical files under different classes, one of
        ``LABEL_CONFLICT_POLICIES``: keep the first copy (in URI order), drop every copy, or
        keep the first and refuse to publish.
      stratify_validation: give every class its share of ``validation`` (``splits``).
      leakage: what to do with validation examples that are near-duplicates of train ones
        (``leakage``): ``report`` them in ``near_duplicates.jsonl`` only, or ``move_to_train``.
      near_duplicate_threshold: the largest Hamming distance between perceptual hashes (of 64
        bits) that makes two examples near-duplicates.
      base: a previous dataset (or a versions root with ``latest``) whose stored examples are
        reused for unchanged source bytes when the image options match (``base``); None for a
        clean build. It is only read, and never recorded in ``manifest_options``: an
        incremental build's dataset equals a clean build's.

    Raises:
      ValueError: naming the bad field and value.
    """

    input: str
    output: str
    image: ImageOptions = dataclasses.field(default_factory=ImageOptions)
    validation_fraction: float = 0.0
    num_shards: int | None = None
    target_shard_mb: float = 128.0
    max_bad_fraction: float = 0.01
    overwrite: bool = False
    resume: bool = False
    staging_file_mb: float = 32.0
    label_conflicts: str = "keep_first"
    stratify_validation: bool = False
    leakage: str = "report"
    near_duplicate_threshold: int = DEFAULT_THRESHOLD
    base: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.input, str) or not self.input:
            raise ValueError(
                f"--input must name a directory, prefix or listing, got {self.input!r}"
            )
        if not isinstance(self.output, str) or not self.output:
            raise ValueError(f"--output must name a directory or prefix, got {self.output!r}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(
                f"--validation_fraction must be in [0, 1), got {self.validation_fraction!r}"
            )
        if self.num_shards is not None and not 1 <= self.num_shards <= MAX_SHARDS:
            raise ValueError(f"--num_shards must be in [1, {MAX_SHARDS}], got {self.num_shards!r}")
        if not self.target_shard_mb > 0:
            raise ValueError(f"--target_shard_mb must be > 0, got {self.target_shard_mb!r}")
        if not self.staging_file_mb > 0:
            raise ValueError(f"--staging_file_mb must be > 0, got {self.staging_file_mb!r}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"--max_bad_fraction must be in [0, 1], got {self.max_bad_fraction!r}")
        if self.label_conflicts not in LABEL_CONFLICT_POLICIES:
            raise ValueError(
                f"--label_conflicts must be one of {', '.join(LABEL_CONFLICT_POLICIES)}, "
                f"got {self.label_conflicts!r}"
            )
        if self.leakage not in LEAKAGE_ACTIONS:
            raise ValueError(
                f"--leakage must be one of {', '.join(LEAKAGE_ACTIONS)}, got {self.leakage!r}"
            )
        threshold = self.near_duplicate_threshold
        if not isinstance(threshold, int) or not 0 <= threshold <= MAX_THRESHOLD:
            raise ValueError(
                f"--near_duplicate_threshold must be an int in [0, {MAX_THRESHOLD}] bits, "
                f"got {threshold!r}"
            )
        out = self.output.rstrip("/")
        if out == self.input.rstrip("/") or out.startswith(self.input.rstrip("/") + "/"):
            raise ValueError(
                f"--output {self.output!r} must not be inside --input {self.input!r}: "
                "a later run would read its own shards as images"
            )
        if self.base is not None and self.base.rstrip("/") == out:
            raise ValueError(
                f"--base {self.base!r} must not be --output: the base is never modified; write "
                "the new version beside it (python -m beam_pipelines.versions ROOT --next)"
            )

    @property
    def target_shard_bytes(self) -> int:
        return int(self.target_shard_mb * 1024 * 1024)

    def manifest_options(self) -> dict[str, Any]:
        """The options recorded in ``dataset.json``.

        Only what shapes the dataset's content: no output location, no runner, nothing
        machine-specific, so that every runner produces the same manifest.
        """
        return {
            "input": self.input,
            "image_size": self.image.image_size,
            "crop": self.image.crop,
            "encoding": self.image.encoding,
            "jpeg_quality": self.image.jpeg_quality,
            "max_pixels": self.image.max_pixels,
            "background": "#{:02x}{:02x}{:02x}".format(*self.image.background),
            "max_aspect_ratio": self.image.max_aspect_ratio,
            "max_output_pixels": self.image.max_output_pixels,
            "out_of_bounds": self.image.out_of_bounds,
            "accepted_formats": list(self.image.accepted_formats),
            "high_bit_depth": self.image.high_bit_depth,
            # Resampling and the encoders live in Pillow: another version may store other bytes.
            "image_library": f"Pillow {PIL.__version__}",
            "validation_fraction": self.validation_fraction,
            "num_shards": self.num_shards,
            "target_shard_mb": self.target_shard_mb,
            "max_bad_fraction": self.max_bad_fraction,
            "label_conflicts": self.label_conflicts,
            "stratify_validation": self.stratify_validation,
            "leakage": self.leakage,
            "near_duplicate_threshold": self.near_duplicate_threshold,
        }


class ImagesToTFRecordOptions(PipelineOptions):
    """The pipeline's own flags; Beam's options are parsed by Beam from the same argv."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument(
            "--input",
            help="directory/prefix laid out as <class name>/<image file>, or a .csv/.jsonl "
            "listing of uri,label (local, gs://, s3://)",
        )
        parser.add_argument("--output", help="dataset directory/prefix to write")
        parser.add_argument(
            "--image_size", type=int, default=256, help="shorter side after resizing (256)"
        )
        parser.add_argument("--crop", choices=CROPS, default="none", help="center: square crop")
        parser.add_argument(
            "--encoding",
            choices=ENCODINGS,
            default="jpeg",
            help="stored encoding; raw (uint8 HWC) requires --crop center",
        )
        parser.add_argument("--jpeg_quality", type=int, default=90, help="JPEG quality (90)")
        parser.add_argument(
            "--max_pixels",
            type=int,
            default=ImageOptions.max_pixels,
            help="reject images whose header declares more pixels (100000000)",
        )
        parser.add_argument(
            "--background",
            default="#ffffff",
            help="colour transparent pixels are composited over (#ffffff)",
        )
        parser.add_argument(
            "--max_aspect_ratio",
            type=float,
            default=ImageOptions.max_aspect_ratio,
            help="longer side over shorter side above which an image is out of bounds, checked "
            "from the header (10)",
        )
        parser.add_argument(
            "--max_output_pixels",
            type=int,
            default=ImageOptions.max_output_pixels,
            help="most pixels a stored image may have; JPEG also caps each side at 65500 "
            f"({ImageOptions.max_output_pixels})",
        )
        parser.add_argument(
            "--out_of_bounds",
            choices=("reject", "crop"),
            default="reject",
            help="images past --max_aspect_ratio or --max_output_pixels: reject them, or keep "
            "the centre of the longer side (reject)",
        )
        parser.add_argument(
            "--accepted_formats",
            default="default",
            help="Pillow formats to accept: 'default' (every raster format Pillow decodes "
            "without external programs), a list 'JPEG,PNG', or changes 'default,+EPS,-TGA' "
            "(default)",
        )
        parser.add_argument(
            "--high_bit_depth",
            choices=HIGH_BIT_DEPTH_POLICIES,
            default="shift",
            help="16-bit samples to 8: shift (v >> 8) or stretch by the real bit depth from "
            "sBIT / BitsPerSample / the largest sample, for 10-14 bit data (shift)",
        )
        parser.add_argument(
            "--validation_fraction",
            type=float,
            default=0.0,
            help="share of examples, chosen by content hash, in the validation split (0)",
        )
        parser.add_argument(
            "--stratify_validation",
            action="store_true",
            default=False,
            help="give every class its share of the validation split (still chosen by content "
            "hash); records then wait until every class is counted",
        )
        parser.add_argument(
            "--num_shards",
            type=int,
            default=None,
            help="train shard count, fixed up front (validation gets a proportional count); "
            "the fastest way to shard. Default: planned from --target_shard_mb",
        )
        parser.add_argument(
            "--target_shard_mb", type=float, default=128.0, help="wanted shard size in MiB (128)"
        )
        parser.add_argument(
            "--max_bad_fraction",
            type=float,
            default=0.01,
            help="largest share of bad input that still publishes the dataset: rejected files "
            "(not counting no_label ones) over files inside a class folder (0.01)",
        )
        parser.add_argument(
            "--label_conflicts",
            choices=LABEL_CONFLICT_POLICIES,
            default="keep_first",
            help="the same bytes under two classes: keep the first copy (in URI order), drop "
            "every copy, or keep the first and refuse to publish (keep_first)",
        )
        parser.add_argument(
            "--leakage",
            choices=LEAKAGE_ACTIONS,
            default="report",
            help="validation examples that are near-duplicates of train ones: report them in "
            "near_duplicates.jsonl, or move them to train before writing (report)",
        )
        parser.add_argument(
            "--near_duplicate_threshold",
            type=int,
            default=DEFAULT_THRESHOLD,
            help="largest Hamming distance between 64-bit perceptual hashes that makes two "
            f"examples near-duplicates, 0-{MAX_THRESHOLD} ({DEFAULT_THRESHOLD})",
        )
        parser.add_argument(
            "--overwrite",
            action="store_true",
            default=False,
            help="replace a dataset already published at --output",
        )
        parser.add_argument(
            "--resume",
            action="store_true",
            default=False,
            help="continue an interrupted build of this command at --output: complete shards are "
            "kept, prepared images are not decoded again, the result is byte-identical",
        )
        parser.add_argument(
            "--staging_file_mb",
            type=float,
            default=32.0,
            help="MiB of prepared examples per staging file, the unit --resume reuses (32)",
        )
        parser.add_argument(
            "--base",
            default=None,
            help="a previous dataset (or versions root with a latest pointer), local or bucket: "
            "its stored examples are reused, without decoding, for images whose bytes are "
            "unchanged when the image options match; the result equals a clean build",
        )


def _absolute(path: str) -> str:
    # Local paths become absolute so that URIs in the shards and reports are unambiguous.
    if "://" in path:
        return path
    return os.path.abspath(path)


def config_from_options(options: PipelineOptions) -> PipelineConfig:
    """Validates the parsed flags into a ``PipelineConfig``.

    Raises:
      ValueError: naming the bad flag and value.
    """
    own = options.view_as(ImagesToTFRecordOptions)
    if not own.input or not own.output:
        raise ValueError("both --input and --output are required")
    return PipelineConfig(
        input=_absolute(own.input),
        output=_absolute(own.output),
        image=ImageOptions(
            image_size=own.image_size,
            crop=own.crop,
            encoding=own.encoding,
            jpeg_quality=own.jpeg_quality,
            max_pixels=own.max_pixels,
            max_aspect_ratio=own.max_aspect_ratio,
            max_output_pixels=own.max_output_pixels,
            out_of_bounds=own.out_of_bounds,
            accepted_formats=parse_accepted_formats(own.accepted_formats),
            high_bit_depth=own.high_bit_depth,
            background=parse_background(own.background),
        ),
        validation_fraction=own.validation_fraction,
        num_shards=own.num_shards,
        target_shard_mb=own.target_shard_mb,
        max_bad_fraction=own.max_bad_fraction,
        overwrite=own.overwrite,
        resume=own.resume,
        staging_file_mb=own.staging_file_mb,
        label_conflicts=own.label_conflicts,
        stratify_validation=own.stratify_validation,
        leakage=own.leakage,
        near_duplicate_threshold=own.near_duplicate_threshold,
        base=_absolute(own.base) if own.base else None,
    )

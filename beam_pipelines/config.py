"""The pipeline's own configuration, validated once, independent of the Beam runner.

``PipelineConfig`` (with ``ImageOptions`` for its ``image`` field) is also where each flag of the
command line is declared: the field's metadata gives its help and ``--help`` group
(``cliflags.flag``), and Beam's ``ImagesToTFRecordOptions`` defines the flags from it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import PIL
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipelines.graph.leakage import AUTO_BUCKETED_FROM, LEAKAGE_ACTIONS, SEARCH_METHODS
from beam_pipelines.graph.near_duplicate_search import DEFAULT_MAX_BUCKET_ENTRIES
from beam_pipelines.graph.splits import QUOTA_RULE, split_rule
from beam_pipelines.image import phash
from beam_pipelines.image.options import ImageOptions
from beam_pipelines.output.shards import LABEL_CONFLICT_POLICIES
from catalog.near_duplicates import DEFAULT_THRESHOLD, MAX_THRESHOLD
from catalog.window_hashes import WINDOW_SCALES
from catalog.window_search import DEFAULT_WINDOW_THRESHOLD, WindowRule
from cliflags import NESTED_FLAGS, add_dataclass_flags, flag, flag_values
from schemas.constants import MAX_SHARDS

__all__ = [
    "HELP_GROUPS",
    "PipelineConfig",
    "ImagesToTFRecordOptions",
    "config_from_options",
    "resolve_search",
    "resolve_image_threads",
    "usable_cores",
]

# The --help groups of the pipeline's flags, in the order they are listed.
HELP_GROUPS = ("input", "image", "sharding", "quality gates", "output")


def _absolute(path: str) -> str:
    # Local paths become absolute so that URIs in the shards and reports are unambiguous.
    if "://" in path:
        return path
    return os.path.abspath(path)


def _absolute_or_none(path: str | None) -> str | None:
    return _absolute(path) if path else None


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
      image_threads: images read and prepared at once in each process that runs the image
        step; 0 (auto) is made a number by ``resolve_image_threads`` before the job starts.
      label_conflicts: what to do with byte-identical files under different classes, one of
        ``LABEL_CONFLICT_POLICIES``: keep the first copy (in URI order), drop every copy, or
        keep the first and refuse to publish.
      stratify_validation: give every class its quota of ``validation``, ``QUOTA_RULE``
        (``splits``); on a ``base``, the base's examples keep their split and new ones fill
        each class's gap to its quota.
      leakage: what to do with validation examples that are near-duplicates of train ones
        (``leakage``): ``report`` them in ``near_duplicates.jsonl`` only, or ``move_to_train``.
      near_duplicate_threshold: the largest Hamming distance between perceptual hashes (of 64
        bits) of two whole frames that makes two examples near-duplicates.
      near_duplicate_window_threshold: the largest distance between the whole frame of one
        example and a centred window of the other (``catalog.window_search``) that makes them
        near-duplicates: a crop and its original.
      near_duplicate_search: ``gathered``, every hash searched in one worker (49 bytes an
        example, the least work), or ``bucketed``, chunk buckets searched on the engine's
        workers (no worker holds every hash; 42 entries of 50 bytes an example cross a
        shuffle at the default thresholds, packed by bucket); ``auto`` is made one of them by ``resolve_search`` before
        the job starts (a graph built from ``auto`` gathers).
        The same pairs below ``MAX_REPORTED_PAIRS``.
      near_duplicate_bucket_entries: with the bucketed search, the most entries one bucket
        search holds; a bigger bucket is searched in blocks (the same pairs).
      base: a previous dataset (or a versions root with ``latest``) whose stored examples are
        reused for unchanged source bytes when the image options match (``base``); None for a
        clean build. It is only read, and its location is never recorded in
        ``manifest_options``: an incremental build's dataset equals a clean build's, except
        with ``stratify_validation``, where the base's examples keep the base's split
        (``split_rule`` says so).

    Raises:
      ValueError: naming the bad field and value.
    """

    input: str = dataclasses.field(
        metadata=flag(
            help="directory/prefix laid out as <class name>/<image file>, or a .csv/.jsonl "
            "listing of uri,label (local, gs://, s3://)",
            group="input",
            parse=_absolute,
        )
    )
    output: str = dataclasses.field(
        metadata=flag(help="dataset directory/prefix to write", group="output", parse=_absolute)
    )
    image: ImageOptions = dataclasses.field(default_factory=ImageOptions, metadata=NESTED_FLAGS)
    validation_fraction: float = dataclasses.field(
        default=0.0,
        metadata=flag(
            help="share of examples, chosen by content hash, in the validation split (%(default)s)",
            group="sharding",
        ),
    )
    stratify_validation: bool = dataclasses.field(
        default=False,
        metadata=flag(
            help="give every class of n examples exactly its quota of the validation split, "
            f"{QUOTA_RULE} (f = --validation_fraction): its k examples of the smallest "
            "split values (bits 64-127 of the content hash). With --base, examples already in "
            "the base keep their split (nothing in the base moves, so a class may stay over "
            "its quota) and new examples fill each class's gap to k. Records wait until every "
            "class is counted",
            group="sharding",
            show_default=False,
        ),
    )
    num_shards: int | None = dataclasses.field(
        default=None,
        metadata=flag(
            help="train shard count, fixed up front (validation gets a proportional count); "
            "the fastest way to shard. Default: planned from --target_shard_mb",
            group="sharding",
            show_default=False,
        ),
    )
    target_shard_mb: float = dataclasses.field(
        default=128.0,
        metadata=flag(help="wanted shard size in MiB (%(default)s)", group="sharding"),
    )
    max_bad_fraction: float = dataclasses.field(
        # A folder of one's own holds a few files that are no images (a text file, an empty or
        # truncated download); a systematic fault (a wrong folder, a decoder that fails on a
        # format) rejects far more than 5 %.
        default=0.05,
        metadata=flag(
            help="largest share of bad input that still publishes the dataset: rejected files "
            "(not counting no_label ones) over files inside a class folder (%(default)s)",
            group="quality gates",
        ),
    )
    overwrite: bool = dataclasses.field(
        default=False,
        metadata=flag(
            help="replace a dataset already published at --output",
            group="output",
            show_default=False,
        ),
    )
    resume: bool = dataclasses.field(
        default=False,
        metadata=flag(
            help="continue an interrupted build of this command at --output: complete shards are "
            "kept, prepared images are not decoded again, the result is byte-identical",
            group="output",
            show_default=False,
        ),
    )
    staging_file_mb: float = dataclasses.field(
        default=32.0,
        metadata=flag(
            help="MiB of prepared examples per staging file, the unit --resume reuses "
            "(%(default)s)",
            group="output",
        ),
    )
    image_threads: int = dataclasses.field(
        default=0,
        metadata=flag(
            help="images read and prepared at once in each process of the image step (Pillow "
            "decodes, resizes and encodes outside Python's lock); 0: every core this process "
            "may use on the in-process runner, 1 on the others, whose workers are processes "
            "already. Each thread has its own --decode_memory_mb worker (%(default)s)",
            group="image",
        ),
    )
    label_conflicts: str = dataclasses.field(
        default="keep_first",
        metadata=flag(
            help="the same bytes under two classes: keep the first copy (in URI order), drop "
            "every copy, or keep the first and refuse to publish (%(default)s)",
            group="quality gates",
            choices=LABEL_CONFLICT_POLICIES,
        ),
    )
    leakage: str = dataclasses.field(
        default="report",
        metadata=flag(
            help="validation examples that are near-duplicates of train ones: report them in "
            "near_duplicates.jsonl, or move them to train before writing (%(default)s)",
            group="quality gates",
            choices=LEAKAGE_ACTIONS,
        ),
    )
    near_duplicate_threshold: int = dataclasses.field(
        default=DEFAULT_THRESHOLD,
        metadata=flag(
            help="largest Hamming distance between 64-bit perceptual hashes that makes two "
            f"examples near-duplicates, 0-{MAX_THRESHOLD} (%(default)s)",
            group="quality gates",
        ),
    )
    near_duplicate_window_threshold: int = dataclasses.field(
        default=DEFAULT_WINDOW_THRESHOLD,
        metadata=flag(
            help="largest Hamming distance between the whole frame of one example and a "
            "centred window (95, 90 or 85 %%) of the other that makes them near-duplicates: "
            f"a crop of up to 15 %% and its original, 0-{MAX_THRESHOLD} (%(default)s)",
            group="quality gates",
        ),
    )
    near_duplicate_search: str = dataclasses.field(
        default="auto",
        metadata=flag(
            help="where the near-duplicate search runs: gathered, every hash in one worker (49 "
            "bytes an example); bucketed, chunk buckets on the engine's workers, for datasets "
            "whose hashes do not fit one worker; auto, bucketed for a listing of "
            f"{AUTO_BUCKETED_FROM:,} inputs or more on a distributed runner, else gathered "
            "(%(default)s; the same pairs)",
            group="quality gates",
            choices=SEARCH_METHODS,
        ),
    )
    near_duplicate_bucket_entries: int = dataclasses.field(
        default=DEFAULT_MAX_BUCKET_ENTRIES,
        metadata=flag(
            help="with --near_duplicate_search bucketed, the most entries one bucket search "
            "holds (392,439 took 362 MB a worker); a bigger bucket is searched in "
            "blocks, each of its entries sent once per block (%(default)s)",
            group="quality gates",
        ),
    )
    base: str | None = dataclasses.field(
        default=None,
        metadata=flag(
            help="a previous dataset (or versions root with a latest pointer), local or bucket: "
            "its stored examples are reused, without decoding, for images whose bytes are "
            "unchanged when the image options match; the result equals a clean build",
            group="output",
            parse=_absolute_or_none,
            show_default=False,
        ),
    )

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
        threads = self.image_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise ValueError(
                f"--image_threads must be an int >= 0 (0: one a core in-process), got {threads!r}"
            )
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
        for name in ("near_duplicate_threshold", "near_duplicate_window_threshold"):
            threshold = getattr(self, name)
            if isinstance(threshold, bool) or not isinstance(threshold, int):
                threshold = None  # refused below, by value
            if threshold is None or not 0 <= threshold <= MAX_THRESHOLD:
                raise ValueError(
                    f"--{name} must be an int in [0, {MAX_THRESHOLD}] bits, "
                    f"got {getattr(self, name)!r}"
                )
        entries = self.near_duplicate_bucket_entries
        if isinstance(entries, bool) or not isinstance(entries, int) or entries < 2:
            raise ValueError(
                f"--near_duplicate_bucket_entries must be an int >= 2, got {entries!r}"
            )
        if self.near_duplicate_search not in SEARCH_METHODS:
            raise ValueError(
                f"--near_duplicate_search must be one of {', '.join(SEARCH_METHODS)}, "
                f"got {self.near_duplicate_search!r}"
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

    @property
    def split_rule(self) -> str:
        """How examples are placed in splits, as ``dataset.json`` records it (``splits``)."""
        return split_rule(stratify=self.stratify_validation, base=self.base is not None)

    @property
    def search_method(self) -> str:
        """``gathered`` or ``bucketed``: how the graph searches (``auto`` unresolved gathers)."""
        return "bucketed" if self.near_duplicate_search == "bucketed" else "gathered"

    @property
    def near_duplicate_rule(self) -> WindowRule:
        """When two examples are near-duplicates: the thresholds and the stored windows."""
        return WindowRule(
            self.near_duplicate_threshold, self.near_duplicate_window_threshold, WINDOW_SCALES
        )

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
            "small_images": self.image.small_images,
            "min_source_side": self.image.min_source_side,
            # Resampling and the encoders live in Pillow: another version may store other bytes.
            "image_library": f"Pillow {PIL.__version__}",
            # How the catalog's perceptual hashes are taken: an image option for reuse, so a
            # base whose hashes were taken otherwise is prepared again, not mixed in.
            "near_duplicate_features": phash.FEATURES,
            # The windows hashed besides the whole frame (the catalog's window_phash): an image
            # option too, so a base without them, or with others, is prepared again.
            "near_duplicate_windows": list(WINDOW_SCALES),
            "validation_fraction": self.validation_fraction,
            "num_shards": self.num_shards,
            "target_shard_mb": self.target_shard_mb,
            "max_bad_fraction": self.max_bad_fraction,
            "label_conflicts": self.label_conflicts,
            "stratify_validation": self.stratify_validation,
            # What placed the examples: a build on a --base keeps the base's splits when
            # stratified, so its dataset then depends on the base.
            "split_rule": self.split_rule,
            "leakage": self.leakage,
            "near_duplicate_threshold": self.near_duplicate_threshold,
            "near_duplicate_window_threshold": self.near_duplicate_window_threshold,
            # Past MAX_REPORTED_PAIRS the two keep different pairs (see leakage.py).
            "near_duplicate_search": self.search_method,
        }


def resolve_search(
    config: PipelineConfig, *, listed_inputs: int | None, in_process: bool
) -> PipelineConfig:
    """``config`` with ``--near_duplicate_search auto`` made ``gathered`` or ``bucketed``.

    ``bucketed`` when the build runs on a distributed runner and its input is a listing of
    about ``AUTO_BUCKETED_FROM`` inputs or more: no worker then holds every hash. Otherwise
    ``gathered``: less work, and Beam's in-process runner would hold the bucketed search's
    whole shuffle in memory. A directory's size is not known before the job lists it, so a
    directory input gathers (pass ``bucketed`` for one of tens of millions of files).

    Args:
      config: the validated flags.
      listed_inputs: about how many inputs the listing names (``estimate_records``), or None
        when the input is a directory.
      in_process: whether the build runs on the in-process runner.
    """
    if config.near_duplicate_search != "auto":
        return config
    large = listed_inputs is not None and listed_inputs >= AUTO_BUCKETED_FROM
    method = "bucketed" if large and not in_process else "gathered"
    return dataclasses.replace(config, near_duplicate_search=method)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and ``taskset``
    narrow), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def resolve_image_threads(config: PipelineConfig, *, one_process: bool) -> PipelineConfig:
    """``config`` with ``--image_threads 0`` made a number: ``usable_cores()`` when the whole
    image step runs in this one process (the in-process runner's default mode), else 1 (a
    distributed runner, or the in-process runner's worker processes, already runs one
    image step a core)."""
    if config.image_threads != 0:
        return config
    return dataclasses.replace(config, image_threads=usable_cores() if one_process else 1)


class ImagesToTFRecordOptions(PipelineOptions):
    """The pipeline's own flags, made from ``PipelineConfig``'s fields; Beam parses them from
    the same argv as its own options."""

    @classmethod
    def _add_argparse_args(cls, parser):
        # Beam parses every registered options class for every pipeline: no flag may be
        # required there (config_from_options says what is missing).
        add_dataclass_flags(parser, PipelineConfig, enforce_required=False)


def config_from_options(options: PipelineOptions) -> PipelineConfig:
    """Validates the parsed flags into a ``PipelineConfig``.

    Raises:
      ValueError: naming the bad flag and value.
    """
    own = options.view_as(ImagesToTFRecordOptions)
    if not own.input or not own.output:
        raise ValueError("both --input and --output are required")
    return PipelineConfig(**flag_values(PipelineConfig, own))

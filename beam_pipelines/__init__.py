"""Images -> deterministic TFRecord shards + ``dataset.json``, as an Apache Beam pipeline.

The command-line modules ``beam_pipelines.images_to_tfrecord`` (``run``, ``main``) and
``beam_pipelines.samples`` are not imported here, so that ``python -m`` runs them once.
"""

from beam_pipelines.builds.resume import ResumeState
from beam_pipelines.config import ImagesToTFRecordOptions, PipelineConfig, config_from_options
from beam_pipelines.elements import (
    CatalogMeta,
    Duplicate,
    PreparedRecord,
    Rejection,
    ShardResult,
    SourceFile,
    StagedRecord,
)
from beam_pipelines.engines.runners import RUNNER_ALIASES, resolve_runner_aliases
from beam_pipelines.graph.plan import PlanShards, estimated_example_bytes, listing_shard_counts
from beam_pipelines.graph.transforms import ImagesToShards, PrepareImages, read_source
from beam_pipelines.image.formats import DEFAULT_ACCEPTED_FORMATS, sniff_format
from beam_pipelines.image.options import ImageOptions, parse_background
from beam_pipelines.image.prepare import (
    REASONS,
    PreparedImage,
    RejectedImage,
    decode_rgb,
    encode_image,
    open_image,
    prepare_image,
    resize_and_crop,
)
from beam_pipelines.inputs.sources import LabelNames, ListSources, is_listing, parse_listing_line
from beam_pipelines.output.publish import (
    DUPLICATES_NAME,
    OutputExistsError,
    StageResults,
    prepare_output,
    publish_manifest,
    read_manifest,
    remove_unlisted_shards,
)
from beam_pipelines.output.shards import (
    METRICS_NAMESPACE,
    TRAIN,
    VALIDATION,
    WriteShards,
    assign_shard,
    assign_split,
    dedupe_sorted,
    fixed_shard_counts,
    plan_shard_counts,
)
from beam_pipelines.output.staging import RecordStager, StagedRecordReader

__all__ = [
    "PipelineConfig",
    "parse_background",
    "Duplicate",
    "CatalogMeta",
    "PreparedRecord",
    "Rejection",
    "ShardResult",
    "SourceFile",
    "StagedRecord",
    "PlanShards",
    "estimated_example_bytes",
    "listing_shard_counts",
    "ResumeState",
    "RecordStager",
    "StagedRecordReader",
    "REASONS",
    "DEFAULT_ACCEPTED_FORMATS",
    "ImageOptions",
    "PreparedImage",
    "RejectedImage",
    "decode_rgb",
    "encode_image",
    "open_image",
    "prepare_image",
    "resize_and_crop",
    "sniff_format",
    "ImagesToTFRecordOptions",
    "config_from_options",
    "DUPLICATES_NAME",
    "OutputExistsError",
    "StageResults",
    "prepare_output",
    "publish_manifest",
    "read_manifest",
    "remove_unlisted_shards",
    "RUNNER_ALIASES",
    "resolve_runner_aliases",
    "METRICS_NAMESPACE",
    "TRAIN",
    "VALIDATION",
    "WriteShards",
    "assign_shard",
    "assign_split",
    "dedupe_sorted",
    "fixed_shard_counts",
    "plan_shard_counts",
    "LabelNames",
    "ListSources",
    "is_listing",
    "parse_listing_line",
    "ImagesToShards",
    "PrepareImages",
    "read_source",
]

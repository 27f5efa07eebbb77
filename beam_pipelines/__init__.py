"""Images -> deterministic TFRecord shards + ``dataset.json``, as an Apache Beam pipeline.

The command-line modules ``beam_pipelines.images_to_tfrecord`` (``run``, ``main``) and
``beam_pipelines.samples`` are not imported here, so that ``python -m`` runs them once. The
names below load on first use (PEP 562): importing the package, or running
``beam_pipelines.samples``, does not import Apache Beam.
"""

from __future__ import annotations

from cliflags import lazy_names

# name -> the module that defines it
_MODULE_OF = {
    # beam_pipelines.builds.resume
    "ResumeState": "beam_pipelines.builds.resume",
    # beam_pipelines.config
    "ImagesToTFRecordOptions": "beam_pipelines.config",
    "PipelineConfig": "beam_pipelines.config",
    "config_from_options": "beam_pipelines.config",
    # beam_pipelines.elements
    "CatalogMeta": "beam_pipelines.elements",
    "Duplicate": "beam_pipelines.elements",
    "PreparedRecord": "beam_pipelines.elements",
    "Rejection": "beam_pipelines.elements",
    "ShardResult": "beam_pipelines.elements",
    "SourceFile": "beam_pipelines.elements",
    "StagedRecord": "beam_pipelines.elements",
    # beam_pipelines.engines.runners
    "RUNNER_ALIASES": "beam_pipelines.engines.runners",
    "resolve_runner_aliases": "beam_pipelines.engines.runners",
    # beam_pipelines.graph.plan
    "PlanShards": "beam_pipelines.graph.plan",
    "estimated_example_bytes": "beam_pipelines.graph.plan",
    "listing_shard_counts": "beam_pipelines.graph.plan",
    # beam_pipelines.graph.transforms
    "ImagesToShards": "beam_pipelines.graph.transforms",
    "PrepareImages": "beam_pipelines.graph.transforms",
    "read_source": "beam_pipelines.graph.transforms",
    # beam_pipelines.image.formats
    "DEFAULT_ACCEPTED_FORMATS": "beam_pipelines.image.formats",
    "sniff_format": "beam_pipelines.image.formats",
    # beam_pipelines.image.options
    "ImageOptions": "beam_pipelines.image.options",
    "parse_background": "beam_pipelines.image.options",
    # beam_pipelines.image.prepare
    "REASONS": "beam_pipelines.image.prepare",
    "PreparedImage": "beam_pipelines.image.prepare",
    "RejectedImage": "beam_pipelines.image.prepare",
    "decode_rgb": "beam_pipelines.image.prepare",
    "encode_image": "beam_pipelines.image.prepare",
    "open_image": "beam_pipelines.image.prepare",
    "prepare_image": "beam_pipelines.image.prepare",
    "resize_and_crop": "beam_pipelines.image.prepare",
    # beam_pipelines.inputs.sources
    "LabelNames": "beam_pipelines.inputs.sources",
    "ListSources": "beam_pipelines.inputs.sources",
    "is_listing": "beam_pipelines.inputs.sources",
    "parse_listing_line": "beam_pipelines.inputs.sources",
    # beam_pipelines.output.publish
    "DUPLICATES_NAME": "beam_pipelines.output.publish",
    "OutputExistsError": "beam_pipelines.output.publish",
    "StageResults": "beam_pipelines.output.publish",
    "prepare_output": "beam_pipelines.output.publish",
    "publish_manifest": "beam_pipelines.output.publish",
    "read_manifest": "beam_pipelines.output.publish",
    "remove_unlisted_shards": "beam_pipelines.output.publish",
    # beam_pipelines.output.shards
    "METRICS_NAMESPACE": "beam_pipelines.output.shards",
    "TRAIN": "beam_pipelines.output.shards",
    "VALIDATION": "beam_pipelines.output.shards",
    "WriteShards": "beam_pipelines.output.shards",
    "assign_shard": "beam_pipelines.output.shards",
    "assign_split": "beam_pipelines.output.shards",
    "dedupe_sorted": "beam_pipelines.output.shards",
    "fixed_shard_counts": "beam_pipelines.output.shards",
    # beam_pipelines.output.staging
    "RecordStager": "beam_pipelines.output.staging",
    "StagedRecordReader": "beam_pipelines.output.staging",
}
__all__ = sorted(_MODULE_OF)

__getattr__, __dir__ = lazy_names(__name__, globals(), _MODULE_OF)

"""The pipeline's Beam steps: read and prepare images, then the whole images -> shards graph.

Bad inputs leave through a tagged ``rejected`` output as ``Rejection`` elements and bump a
``rejected_<reason>`` counter; they never raise out of a DoFn.
"""

from __future__ import annotations

import hashlib

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_pipelines.catalog_io import MergeCatalogs
from beam_pipelines.config import PipelineConfig
from beam_pipelines.elements import CatalogMeta, PreparedRecord, Rejection, SourceFile
from beam_pipelines.images import ImageOptions, RejectedImage, internal_error, prepare_image
from beam_pipelines.object_store_io import read_with_retries
from beam_pipelines.progress import ProgressReporter, ProgressSpec, reporter_for
from beam_pipelines.shards import (
    DUPLICATES_TAG,
    METRICS_NAMESPACE,
    WriteShards,
    fixed_shard_counts,
)
from beam_pipelines.sources import SKIPPED_TAG, LabelNames, ListSources
from beam_pipelines.splits import AssignSplits
from schemas.image_example import ImageRecord, serialize_record

__all__ = [
    "REJECTED_TAG",
    "read_source",
    "PrepareImageFn",
    "PrepareImages",
    "ImagesToShards",
]

REJECTED_TAG = "rejected"


def read_source(uri: str) -> bytes:
    """Reads a whole input file through Beam FileSystems (any scheme), never decompressing.

    Raises:
      RejectedImage: ``unreadable``, naming the URI and the underlying error.
    """

    def read() -> bytes:
        with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            return handle.read()

    try:
        # Object stores fail transiently (503s, resets): retried, so they never reject an image.
        return read_with_retries(uri, read)
    except Exception as e:  # noqa: BLE001  (each FileSystem raises its own types)
        raise RejectedImage("unreadable", f"cannot read {uri}: {type(e).__name__}: {e}") from e


class PrepareImageFn(beam.DoFn):
    """``SourceFile -> PreparedRecord``; ``Rejection`` on the ``rejected`` output.

    Side input ``label_names``: the sorted class names, whose positions are the labels.
    ``progress`` says how the images done are shown while the pipeline runs.
    """

    def __init__(self, options: ImageOptions, progress: ProgressSpec | None = None) -> None:
        self._options = options
        self._progress = progress
        self._reporter: ProgressReporter | None = None
        self._read = Metrics.counter(METRICS_NAMESPACE, "images_read")
        self._bytes_read = Metrics.counter(METRICS_NAMESPACE, "bytes_read")
        self._prepared = Metrics.counter(METRICS_NAMESPACE, "images_prepared")
        self._drafted = Metrics.counter(METRICS_NAMESPACE, "jpeg_dct_downscaled")
        self._labels: tuple[str, ...] | None = None
        self._index: dict[str, int] = {}

    def _label_index(self, label_names: tuple[str, ...]) -> dict[str, int]:
        if label_names is not self._labels:
            self._labels = label_names
            self._index = {name: i for i, name in enumerate(label_names)}
        return self._index

    def setup(self) -> None:
        if self._progress is not None:
            self._reporter = reporter_for(self._progress)

    def process(self, source: SourceFile, label_names: tuple[str, ...]):
        try:
            record = self._prepare(source, self._label_index(label_names))
        except Exception as error:  # noqa: BLE001  (per-image work never takes the job down)
            rejected = error if isinstance(error, RejectedImage) else internal_error(error)
            if self._reporter is not None:
                self._reporter.add(rejected=1)
            Metrics.counter(METRICS_NAMESPACE, f"rejected_{rejected.reason}").inc()
            yield beam.pvalue.TaggedOutput(
                REJECTED_TAG, Rejection(source.uri, rejected.reason, rejected.detail)
            )
            return
        if self._reporter is not None:
            self._reporter.add(prepared=1)
        yield record

    def _prepare(self, source: SourceFile, index: dict[str, int]) -> PreparedRecord:
        if source.label is None:
            raise RejectedImage(
                "no_label", "the file is not inside a class directory (<class name>/<image file>)"
            )
        data = read_source(source.uri)
        self._read.inc()
        self._bytes_read.inc(len(data))
        sha256 = hashlib.sha256(data).hexdigest()
        prepared = prepare_image(data, self._options)
        Metrics.counter(METRICS_NAMESPACE, f"source_format_{prepared.source_format}").inc()
        for event in prepared.events:  # icc_converted, high_bit_depth_*, cropped_out_of_bounds
            Metrics.counter(METRICS_NAMESPACE, event).inc()
        if prepared.decoded_size != prepared.source_size:
            self._drafted.inc()
        try:
            record = ImageRecord(
                encoded=prepared.encoded,
                format=prepared.format,
                height=prepared.height,
                width=prepared.width,
                channels=prepared.channels,
                label=index[source.label],
                text=source.label,
                filename=source.uri,
                sha256=sha256,
            )
        except ValueError as e:
            raise RejectedImage("invalid_record", f"example breaks the schema: {e}") from e
        self._prepared.inc()
        meta = CatalogMeta(
            label=record.label,
            text=record.text,
            height=record.height,
            width=record.width,
            format=record.format,
            source_format=prepared.source_format,
            source_bytes=len(data),
            source_height=prepared.source_size[1],
            source_width=prepared.source_size[0],
        )
        return PreparedRecord(sha256, source.uri, serialize_record(record), meta)


class PrepareImages(beam.PTransform):
    """``SourceFile -> PreparedRecord`` with a ``rejected`` output of ``Rejection``.

    Args:
      options: how to prepare each image.
      label_names: a one-element PCollection holding the sorted class names.
    """

    def __init__(self, options: ImageOptions, label_names, progress: ProgressSpec | None = None):
        super().__init__()
        self._options = options
        self._label_names = label_names
        self._progress = progress

    def expand(self, sources):
        return sources | "Prepare" >> beam.ParDo(
            PrepareImageFn(self._options, self._progress),
            beam.pvalue.AsSingleton(self._label_names),
        ).with_outputs(REJECTED_TAG, main="records")


class ImagesToShards(beam.PTransform):
    """``PBegin -> dict`` of the pipeline's results, the shards written as a side effect.

    Returns a dict with:
      ``sources``: ``SourceFile`` for every input;
      ``skipped``: the URI of every hidden or system file skipped (never an input);
      ``label_names``: one element, the sorted class names;
      ``shards``: ``ShardResult`` for every shard written;
      ``rejected``: ``Rejection`` for every input that did not become an example;
      ``duplicates``: ``Duplicate`` for every input dropped as a byte-identical copy;
      ``catalogs``: ``CatalogResult`` for every split's merged catalog.

    ``progress`` says how the image step shows the images done (None: not at all).
    """

    def __init__(self, config: PipelineConfig, progress: ProgressSpec | None = None) -> None:
        super().__init__()
        self._config = config
        self._progress = progress

    def expand(self, pbegin):
        config = self._config
        listed = pbegin | "ListSources" >> ListSources(config.input)
        sources = listed["sources"]
        # SourceFile
        label_names = sources | "LabelNames" >> LabelNames()
        # tuple[str, ...], one element
        prepared = sources | "PrepareImages" >> PrepareImages(
            config.image, label_names, self._progress
        )
        fraction = config.validation_fraction
        by_split = prepared.records | "AssignSplit" >> AssignSplits(
            fraction,
            stratify=config.stratify_validation,
            label_conflicts=config.label_conflicts,
        )
        # (split, PreparedRecord)
        if config.num_shards is not None:
            # Counts known now: records go straight from the image step to the group-by-shard.
            sharding = {"shard_counts": fixed_shard_counts(config.num_shards, fraction)}
        else:
            sharding = {"target_shard_bytes": config.target_shard_bytes}
        written = by_split | "WriteShards" >> WriteShards(
            config.output, label_conflicts=config.label_conflicts, **sharding
        )
        catalogs = written["shards"] | "MergeCatalogs" >> MergeCatalogs(config.output)
        # CatalogResult, one per split
        return {
            "sources": sources,
            "skipped": listed[SKIPPED_TAG],
            "label_names": label_names,
            "shards": written["shards"],
            "rejected": prepared[REJECTED_TAG],
            "duplicates": written[DUPLICATES_TAG],
            "catalogs": catalogs,
        }

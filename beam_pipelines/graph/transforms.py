"""The pipeline's Beam steps: read and prepare images, then the whole images -> shards graph.

Bad inputs leave through a tagged ``rejected`` output as ``Rejection`` elements and bump a
``rejected_<reason>`` counter; they never raise out of a DoFn.

The image step reads each source's bytes, hashes them, decides how the example is made
(``PrepareImageFn._prepare``: the one place that may reuse an example made before instead of
decoding), and stages it (``staging.RecordStager``): only a small ``StagedRecord`` location
leaves the step, once the example's bytes are durable in ``DST/.staging/records/``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import threading
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from beam_pipelines.builds.base_splits import BaseSplitsSpec, ReadBaseSplits
from beam_pipelines.builds.incremental import BaseDamagedError, BaseDataset, BaseSpec, load_base
from beam_pipelines.builds.resume import (
    REUSED_TAG,
    ResumeState,
    SplitReusable,
    StagedFromEarlierAttempts,
    VerifyDoneShards,
)
from beam_pipelines.config import PipelineConfig
from beam_pipelines.elements import (
    CatalogMeta,
    PreparedRecord,
    Rejection,
    SourceFile,
    StagedRecord,
)
from beam_pipelines.engines.filesystems import read_object
from beam_pipelines.graph.leakage import (
    FindNearDuplicates,
    MoveLeakageToTrain,
    ReportNearDuplicates,
)
from beam_pipelines.graph.plan import PlanShards
from beam_pipelines.graph.splits import AssignSplits
from beam_pipelines.image.bounds import BoundedPreparer
from beam_pipelines.image.phash import window_hashes
from beam_pipelines.image.prepare import (
    ImageOptions,
    PreparedImage,
    RejectedImage,
    internal_error,
)
from beam_pipelines.inputs.sources import SKIPPED_TAG, LabelNames, ListSources, unpack_sources
from beam_pipelines.output.catalog_io import MergeCatalogs
from beam_pipelines.output.shards import (
    DUPLICATES_TAG,
    METRICS_NAMESPACE,
    WriteShards,
    fixed_shard_counts,
)
from beam_pipelines.output.staging import DEFAULT_FILE_BYTES, RecordStager
from beam_pipelines.progress import ProgressReporter, ProgressSpec, reporter_for
from schemas.image_example import ImageRecord, serialize_record

__all__ = [
    "REJECTED_TAG",
    "read_source",
    "PrepareImageFn",
    "PrepareImages",
    "ImagesToShards",
]

REJECTED_TAG = "rejected"
# Images read and prepared ahead on the image threads, per thread: enough that none waits
# while the bundle's thread stages the results in order.
_AHEAD_PER_THREAD = 2


class _ReadAhead(NamedTuple):
    """What an image thread did for one source: its key, its size and the prepared image or
    why it was rejected; or, where the base may hold the key, the bytes themselves (the
    bundle's thread then decides whether to prepare them)."""

    sha256: str
    source_bytes: int
    prepared: PreparedImage | Exception | None
    data: bytes | None = None


def read_source(uri: str) -> bytes:
    """Reads a whole input file through the project's one storage layer (``objstore``, with the
    ``--s3_*`` flags' settings; other schemes through Beam FileSystems), never decompressing.

    Raises:
      RejectedImage: ``unreadable``, naming the URI and the underlying error.
    """
    try:
        # Object stores fail transiently (503s, resets): retried, so they never reject an image.
        return read_object(uri)
    except Exception as e:  # each store raises its own types
        raise RejectedImage("unreadable", f"cannot read {uri}: {type(e).__name__}: {e}") from e


class PrepareImageFn(beam.DoFn):
    """``SourceFile -> StagedRecord`` (or ``PreparedRecord`` without a staging area);
    ``Rejection`` on the ``rejected`` output. An element may also be a packed batch of
    ``SourceFile`` (``sources.unpack_sources``), each of which is prepared.

    Side input ``label_names``: the sorted class names, whose positions are the labels.
    ``progress`` says how the images done are shown while the pipeline runs. ``staging``: the
    dataset directory whose staging area receives the examples; None yields each
    ``PreparedRecord`` itself (tests, benchmarks). ``base``: a previous dataset whose stored
    example is reused, without decoding, for source bytes it holds (``beam_pipelines.builds.incremental``).

    ``threads``: images read and prepared at once. Above 1, a pool reads and prepares up to
    ``_AHEAD_PER_THREAD`` images a thread ahead (Pillow's decode, resample and encode release
    the GIL), each thread with its own decode worker, while the bundle's thread takes the
    results in input order: counters, reuse, staging and outputs stay on the bundle's thread
    and come out as in a serial run, so the staged bytes and the dataset are the same.
    """

    def __init__(
        self,
        options: ImageOptions,
        progress: ProgressSpec | None = None,
        *,
        staging: str | None = None,
        staging_file_bytes: int = DEFAULT_FILE_BYTES,
        base: BaseSpec | None = None,
        threads: int = 1,
    ) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"--image_threads must be an int >= 1 here, got {threads!r}")
        self._threads = threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # Made in setup (neither pickles): work read ahead, in input order; each image
        # thread's own preparer.
        self._ahead: collections.deque[tuple[SourceFile, dict[str, int], concurrent.futures.Future]]
        self._ahead = collections.deque()
        self._thread_state: threading.local | None = None
        self._thread_preparers: list[BoundedPreparer] = []
        self._options = options
        self._progress = progress
        self._staging = staging
        self._staging_file_bytes = staging_file_bytes
        self._base_spec = base
        self._base: BaseDataset | None = None
        self._reused = Metrics.counter(METRICS_NAMESPACE, "images_reused")
        self._stager: RecordStager | None = None
        self._reporter: ProgressReporter | None = None
        self._read = Metrics.counter(METRICS_NAMESPACE, "images_read")
        self._bytes_read = Metrics.counter(METRICS_NAMESPACE, "bytes_read")
        self._prepared = Metrics.counter(METRICS_NAMESPACE, "images_prepared")
        self._drafted = Metrics.counter(METRICS_NAMESPACE, "jpeg_dct_downscaled")
        self._labels: tuple[str, ...] | None = None
        self._index: dict[str, int] = {}
        # (sha256, uri) -> luma sample of an example whose location is not out yet: hashed with
        # the rest of its staging file when the stager hands the locations on (image_hash).
        self._samples: dict[tuple[str, str], bytes] = {}
        # Decodes run in a worker process held within --decode_memory_mb and --decode_time_s.
        self._preparer: BoundedPreparer | None = None

    def _with_hashes(self, records):
        """Fills in ``meta.phash`` and ``meta.window_phash`` (the near-duplicate features) of
        the records whose luma samples wait, all at once."""
        records = list(records)
        waiting = [i for i, r in enumerate(records) if (r.sha256, r.uri) in self._samples]
        if not waiting:
            return records
        samples = [self._samples.pop((records[i].sha256, records[i].uri)) for i in waiting]
        for i, hashes in zip(waiting, window_hashes(samples).tolist(), strict=True):
            meta = records[i].meta._replace(phash=hashes[0], window_phash=tuple(hashes[1:]))
            records[i] = records[i]._replace(meta=meta)
        return records

    def _label_index(self, label_names: tuple[str, ...]) -> dict[str, int]:
        if label_names is not self._labels:
            self._labels = label_names
            self._index = {name: i for i, name in enumerate(label_names)}
        return self._index

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_pool=None, _ahead=collections.deque(), _thread_state=None)
        state.update(_thread_preparers=[])
        return state

    def setup(self) -> None:
        self._thread_state = threading.local()
        if self._progress is not None:
            self._reporter = reporter_for(self._progress)
        if self._base_spec is not None:
            self._base = load_base(self._base_spec)

    def start_bundle(self) -> None:
        if self._staging is not None:
            if self._stager is not None:
                self._stager.close()  # left by a failed bundle: its records were never emitted
            # Perceptual hashes are filled in per committed file, before its sidecar is written.
            self._stager = RecordStager(
                self._staging, max_file_bytes=self._staging_file_bytes, finalize=self._with_hashes
            )
        self._samples = {}  # a failed bundle's records were never emitted
        self._drop_ahead()

    def finish_bundle(self):
        while self._ahead:
            for out in self._next_ahead():
                if isinstance(out, beam.pvalue.TaggedOutput):
                    yield beam.pvalue.TaggedOutput(out.tag, GlobalWindows.windowed_value(out.value))
                else:
                    yield GlobalWindows.windowed_value(out)
        if self._stager is not None:
            for staged in self._with_hashes(self._stager.flush()):
                yield GlobalWindows.windowed_value(staged)

    def teardown(self) -> None:
        self._drop_ahead()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._stager is not None:
            self._stager.close()
        for preparer in [self._preparer, *self._thread_preparers]:
            if preparer is not None:
                preparer.close()
        self._thread_preparers = []

    def _drop_ahead(self) -> None:
        # Work read ahead for a failed bundle, or left at teardown: never emitted.
        while self._ahead:
            self._ahead.popleft()[2].cancel()

    def process(
        self, element: SourceFile | bytes, label_names: tuple[str, ...], total: int | None = None
    ):
        # A packed batch of inputs (sources.ListSources' "batches") or one input.
        if total is not None and self._reporter is not None:
            self._reporter.set_total(total)
        sources = unpack_sources(element) if isinstance(element, bytes) else [element]
        index = self._label_index(label_names)
        if self._threads == 1:
            for source in sources:
                yield from self._process_one(source, index)
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="prepare-image"
            )
        for source in sources:
            self._ahead.append((source, index, self._pool.submit(self._read_ahead, source)))
            while len(self._ahead) > _AHEAD_PER_THREAD * self._threads:
                yield from self._next_ahead()

    def _next_ahead(self):
        source, index, future = self._ahead.popleft()
        yield from self._process_one(source, index, future)

    def _read_ahead(self, source: SourceFile) -> _ReadAhead | None:
        """On an image thread: reads, hashes and prepares one source; None for a source
        known bad without reading (``_prepare`` rejects it). Read errors raise (through the
        future); errors of preparing are returned, so that the read is still counted."""
        if source.problem is not None or source.label is None:
            return None
        data = read_source(source.uri)
        sha256 = hashlib.sha256(data).hexdigest()
        if self._base is not None and self._base.may_hold(sha256):
            return _ReadAhead(sha256, len(data), None, data)
        state = self._thread_state
        if state is None:  # made in setup, which Beam calls before any bundle
            raise RuntimeError("PrepareImageFn.setup was not called")
        preparer = getattr(state, "preparer", None)
        if preparer is None:
            preparer = state.preparer = BoundedPreparer(self._options)
            self._thread_preparers.append(preparer)
        try:
            return _ReadAhead(sha256, len(data), preparer.prepare(data))
        except Exception as e:  # rejected on the bundle's thread, in order
            return _ReadAhead(sha256, len(data), e)

    def _process_one(
        self,
        source: SourceFile,
        index: dict[str, int],
        ahead: concurrent.futures.Future | None = None,
    ):
        try:
            early = None if ahead is None else ahead.result()
            record = self._prepare(source, index, early)
        except BaseDamagedError:
            raise  # a damaged base fails the build: never a rejection, never a silent rebuild
        except Exception as error:  # per-image work never takes the job down
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
        if self._stager is None or isinstance(record, StagedRecord):
            yield from self._with_hashes([record])  # (a base's example used where it lies)
        else:
            # Locations come out only once their staging file is committed.
            yield from self._with_hashes(
                self._stager.add(record.sha256, record.uri, record.serialized, record.meta)
            )

    def _prepare(
        self, source: SourceFile, index: dict[str, int], early: _ReadAhead | None = None
    ) -> PreparedRecord | StagedRecord:
        # read bytes -> sha256 -> decide (reuse an example made before, or prepare) -> staged
        # by the caller. Inputs a resumed build staged before never get here (SplitReusable).
        # ``early``: what an image thread already read and prepared (``_read_ahead``).
        if source.problem is not None:  # a bad listing line or class name, known unread
            raise RejectedImage(*source.problem)
        if source.label is None:
            raise RejectedImage(
                "no_label", "the file is not inside a class directory (<class name>/<image file>)"
            )
        data = b""
        if early is None:
            data = read_source(source.uri)
            sha256, source_bytes = hashlib.sha256(data).hexdigest(), len(data)
        else:
            sha256, source_bytes = early.sha256, early.source_bytes
        self._read.inc()
        self._bytes_read.inc(source_bytes)
        # The source as the new build names it, for looking it up in the base.
        named: dict[str, Any] = {
            "uri": source.uri,
            "label": index[source.label],
            "text": source.label,
        }
        if self._base is not None and self._staging is not None:
            located = self._base.locate(sha256, **named, source_bytes=source_bytes)
            if located is not None:  # the very example a clean build writes: not even read
                self._reused.inc()
                return located
        if self._base is not None:
            reused = self._base.reuse(sha256, **named, source_bytes=source_bytes)
            if reused is not None:  # the base's stored example, relabelled if need be: no decode
                self._reused.inc()
                return PreparedRecord(sha256, source.uri, reused.serialized, reused.meta)
        prepared = self._prepared_image(source, data, early)
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
            source_bytes=source_bytes,
            source_height=prepared.source_size[1],
            source_width=prepared.source_size[0],
        )
        if prepared.luma_sample is not None:
            self._samples[(sha256, source.uri)] = prepared.luma_sample
        return PreparedRecord(sha256, source.uri, serialize_record(record), meta)

    def _prepared_image(
        self, source: SourceFile, data: bytes, early: _ReadAhead | None
    ) -> PreparedImage:
        # What the image thread prepared, or (serial, or a key the base turned out not to
        # serve) prepared here, on the bundle's thread.
        if early is not None and early.prepared is not None:
            if isinstance(early.prepared, Exception):
                raise early.prepared
            return early.prepared
        if early is not None and early.data is not None:  # the base may have held it, did not
            data = early.data
        self._preparer = self._preparer or BoundedPreparer(self._options)
        return self._preparer.prepare(data)


class PrepareImages(beam.PTransform):
    """``SourceFile`` (or a packed batch of them) ``-> StagedRecord`` (``PreparedRecord``
    without ``staging``) with a ``rejected`` output of ``Rejection``.

    Args:
      options: how to prepare each image.
      label_names: a one-element PCollection holding the sorted class names.
      progress: how the images done are shown.
      staging: the dataset directory whose staging area receives the examples.
      staging_file_bytes: commit a staging file once it holds this many bytes.
      base: a previous dataset to reuse examples from (``--base``).
      total: a one-element PCollection holding how many inputs the step receives, for the
        progress bar's total and time left; None: the bar counts without a total.
      threads: images read and prepared at once by each instance (``PrepareImageFn``).
    """

    def __init__(
        self,
        options: ImageOptions,
        label_names,
        progress: ProgressSpec | None = None,
        *,
        staging: str | None = None,
        staging_file_bytes: int = DEFAULT_FILE_BYTES,
        base: BaseSpec | None = None,
        total=None,
        threads: int = 1,
    ):
        super().__init__()
        self._options = options
        self._label_names = label_names
        self._progress = progress
        self._staging = staging
        self._staging_file_bytes = staging_file_bytes
        self._base = base
        self._total = total
        self._threads = threads

    def expand(self, sources):
        total = {} if self._total is None else {"total": beam.pvalue.AsSingleton(self._total)}
        return sources | "Prepare" >> beam.ParDo(
            PrepareImageFn(
                self._options,
                self._progress,
                staging=self._staging,
                staging_file_bytes=self._staging_file_bytes,
                base=self._base,
                threads=self._threads,
            ),
            beam.pvalue.AsSingleton(self._label_names),
            **total,
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
      ``catalogs``: ``CatalogResult`` for every split's merged catalog;
      ``near_duplicates``: one dict counting the near-duplicate pairs (``leakage``), whose
      report ``near_duplicates.jsonl`` is written.

    ``progress`` says how the image step shows the images done (None: not at all).
    ``resume`` (``resume.ResumeState``) hands over what an interrupted build left: its shard
    counts, the shards it completed and the examples it staged. ``base``: an opened ``--base``
    whose image options match (``base.BaseDataset.spec``), to reuse examples from.
    ``base_splits``: with ``--stratify_validation`` on a ``--base``, the base's catalogs
    (``base_splits.base_splits_spec``), whose examples keep their split.

    Raises:
      ValueError: for ``--stratify_validation`` with ``config.base`` but no ``base_splits``.
    """

    def __init__(
        self,
        config: PipelineConfig,
        progress: ProgressSpec | None = None,
        *,
        resume: ResumeState | None = None,
        base: BaseSpec | None = None,
        base_splits: BaseSplitsSpec | None = None,
    ) -> None:
        super().__init__()
        if config.stratify_validation and config.base and base_splits is None:
            raise ValueError(
                f"--stratify_validation with --base {config.base} keeps the base's splits: "
                "pass its base_splits (base_splits.base_splits_spec)"
            )
        self._config = config
        self._progress = progress
        self._resume = resume or ResumeState()
        self._base = base
        self._base_splits = base_splits

    def _progress_total(self, counted):
        """How many inputs the image step receives (one element), for a progress bar; None
        for other progress modes: only a bar, in this process, shows it, and runs without one
        keep the graph they had."""
        if self._progress is None or self._progress.mode != "bar":
            return None
        return counted | "CountForProgress" >> beam.combiners.Count.Globally()

    def _prepare(self, pbegin, listed, label_names):
        """The image step over what an earlier attempt did not stage; returns its outputs and
        every ``StagedRecord``, the reused ones included."""
        config, resume, sources = self._config, self._resume, listed["sources"]
        to_prepare, reused = listed["batches"], []
        # bytes: packed batches of the sources, unpacked by the image step itself
        counted = sources
        if resume.sidecars:
            earlier = pbegin | "StagedEarlier" >> StagedFromEarlierAttempts(resume.sidecars)
            split = sources | "ReuseStaged" >> SplitReusable(earlier)
            to_prepare, reused = split.sources, [split[REUSED_TAG]]
            counted = split.sources
        prepared = to_prepare | "PrepareImages" >> PrepareImages(
            config.image,
            label_names,
            self._progress,
            staging=config.output,
            staging_file_bytes=int(config.staging_file_mb * 2**20),
            base=self._base,
            total=self._progress_total(counted),
            threads=config.image_threads or 1,  # a graph built from 0 (auto) runs one
        )
        # StagedRecord, and Rejection on the rejected output
        records = prepared.records
        if reused:
            records = (records, *reused) | "WithReused" >> beam.Flatten()
        return prepared, records

    def expand(self, pbegin):
        config = self._config
        listed = pbegin | "ListSources" >> ListSources(config.input)
        sources = listed["sources"]
        # SourceFile
        label_names = sources | "LabelNames" >> LabelNames()
        # tuple[str, ...], one element
        fraction = config.validation_fraction
        resume = self._resume
        counts = resume.shard_counts
        if counts is None and config.num_shards is not None:
            counts = fixed_shard_counts(config.num_shards, fraction)
        plan = sources | "PlanShards" >> PlanShards(
            config.output,
            counts=counts,
            image=config.image,
            validation_fraction=fraction,
            target_shard_bytes=config.target_shard_bytes,
            options=config.manifest_options(),
        )
        # {split: num_shards}, one element; plan.json is saved before any shard is written
        prepared, records = self._prepare(pbegin, listed, label_names)
        done = None
        if resume.done_records:
            done = pbegin | "DoneShards" >> VerifyDoneShards(config.output, resume.done_records)
        base_splits = None
        if self._base_splits is not None and config.stratify_validation:
            base_splits = pbegin | "BaseSplits" >> ReadBaseSplits(self._base_splits)
            # (key, split) of every example of the base
        by_split = records | "AssignSplit" >> AssignSplits(
            fraction,
            stratify=config.stratify_validation,
            label_conflicts=config.label_conflicts,
            base_splits=base_splits,
        )
        # (split, StagedRecord)
        rule, leakage = config.near_duplicate_rule, config.leakage
        found = by_split | "FindNearDuplicates" >> FindNearDuplicates(
            rule=rule,
            action=leakage,
            gathered=config.search_method == "gathered",
            max_bucket_entries=config.near_duplicate_bucket_entries,
        )
        # {"a", "b", ..., "moved"}: the pairs by key number, one element
        if config.leakage == "move_to_train":
            # Every record waits for the search over all of them, then leakage goes to train.
            by_split = by_split | "MoveLeakageToTrain" >> MoveLeakageToTrain(found)
        written = by_split | "WriteShards" >> WriteShards(
            config.output, plan=plan, done=done, label_conflicts=config.label_conflicts
        )
        catalogs = written["shards"] | "MergeCatalogs" >> MergeCatalogs(config.output)
        # CatalogResult, one per split
        near_summary = catalogs | "ReportNearDuplicates" >> ReportNearDuplicates(
            config.output, found, rule=rule, action=leakage
        )
        # dict of counts, one element; near_duplicates.jsonl written
        return {
            "sources": sources,
            "skipped": listed[SKIPPED_TAG],
            "label_names": label_names,
            "shards": written["shards"],
            "rejected": prepared[REJECTED_TAG],
            "duplicates": written[DUPLICATES_TAG],
            "catalogs": catalogs,
            "near_duplicates": near_summary,
        }

"""Beam's DaskRunner, corrected so that every branch of a batch pipeline runs on a Dask cluster.

Beam 2.77's ``apache_beam.runners.dask.dask_runner.DaskRunner`` translates a pipeline into
``dask.bag`` operations, but as shipped it:

* computes only the bag of the *last* transform it visits, so every other branch (a rejected
  report, a side-input consumer) silently never runs;
* gives every consumer of a multi-output ``ParDo`` all of its outputs, main and tagged mixed;
* treats ``Reshuffle`` as the identity, so everything that descends from a one-element
  ``Create`` (``MatchFiles`` of one pattern, for example) stays in one partition, on one worker;
* combines without lifting: every element of a ``CombineGlobally``, ``Count.Globally`` or
  ``Distinct`` crosses a shuffle and lands in one task, on one worker;
* drops outputs emitted in ``finish_bundle``;
* re-runs the whole upstream graph inside a task to read a side input;
* reports no metrics (``metrics()`` raises ``NotImplementedError``);
* cannot run ``Impulse`` or ``Read`` and treats windowing as a no-op.

What it implements. Batch pipelines in the global window, with Beam's option surface
(``DaskOptions``: ``--dask_client_address``, ``--dask_npartitions``, ...) unchanged. The
composites ``Create``, ``Reshuffle``, ``io.Read``, ``GroupByKey`` and ``Flatten`` are replaced
by the primitives of ``dask_primitives``; those, ``Impulse``, ``WindowInto(GlobalWindows())``
and ``ParDo`` (main, tagged and side inputs and outputs, ``finish_bundle`` outputs) are
translated to one bag per PCollection: tagged outputs filtered per tag, side inputs passed as
graph dependencies, a ``Reshuffle`` that spreads its elements evenly over partitions of
bounded size, combines lifted (Beam's ``LiftedCombinePerKey``: one accumulator per key and
partition crosses the shuffle), every unconsumed PCollection computed, and Beam metrics merged
on each worker and collected from every worker when the run ends.

What it does not. Windows other than the global one, and stateful, timely or splittable DoFns,
are refused naming the step; unbounded sources (streaming) are not supported. Beam's own
``apache_beam/runners/dask/dask_runner_test.py`` runs against this class unchanged
(``tests/test_dask_runner_beam_suite.py``), and fails only where it windows. The two private
Beam names it needs (an output handler, a side input's view options) come from
``beam_internals``.

Memory. A Dask worker keeps each task's whole output (a partition's list of elements) until
every task that reads it is done, so a worker's memory follows the partitions' sizes. A
partition count fixed when the graph is built makes them grow with the data: before this,
``Reshuffle`` kept the partitions it was given (after a listing: one per class directory) and
every per-image step ran in tasks of ``inputs / classes`` images. So a ``Reshuffle`` counts
its input first: everything upstream of it is computed (persisted on the workers, each task
once), then the elements are cut into partitions of ``DEFAULT_RESHUFFLE_PARTITION_SIZE``
(``--dask_partition_size``) elements, at least ``DEFAULT_PARTITIONS_PER_THREAD`` per worker
thread when there are that many (``--dask_npartitions`` fixes the count instead). Running the
pipeline therefore starts by computing what precedes its first ``Reshuffle`` (the listing),
and a failure there is raised by ``run()``. A ``GroupByKey`` merges every
``GROUP_INPUTS_PER_PARTITION`` of its input partitions into one (at least the per-thread count
remain) and shuffles into that many: its partitions, too, hold a bounded number of elements
(before, they were merged back to the per-thread count, and each held an eighth of all the
data on two threads), and Dask's task shuffle stays a stage or two of tasks.

Order. Dask orders one graph's tasks itself (``dask.order``), and in a build it ran the image
step over every partition before the steps that read its output (the shard assignment, the
near-duplicate search's first map), so every record was held at once: about 1 KB an image over
the workers, 540 MB a worker at 1 M simulated images. Each step's tasks are therefore
annotated with a priority one above the highest of the steps it reads (its depth in the
pipeline), and the graph goes to the scheduler unoptimised (fusion drops annotations): a
partition's readers run as soon as it is made, and the records held stay at a few partitions'
worth (10-40 MB a worker at 1 M; the larger worker's peak 891 -> 560 MB, the same CPU).

Cost. Each step runs once per partition, so what a task pays besides its elements is paid
``steps x partitions`` times, and what an element pays, once per step. A worker builds a
step's ``DoFnSignature`` (which inspects every method of the DoFn: about 2 ms) once, and binds
a copy of it to each task's own deserialised DoFn; every element is wrapped in the one shared
global-window tuple; and every partition is returned as a ``_Partition``, a ``list`` that Dask
pickles whole when it moves to another worker (it sends a plain ``list`` element by element,
about ten times the cost). A side input's task names its bag's partitions directly: a list of
``Delayed`` values would make Dask cull the whole upstream graph again for each side input.
"""

from __future__ import annotations

import copy
import logging
import math
import pickle
import threading
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics.execution import MetricsContainer, MetricUpdates
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor, PTransformOverride
from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature
from apache_beam.runners.dask import dask_runner as beam_dask
from apache_beam.runners.dask import transform_evaluator as beam_eval
from apache_beam.runners.direct.direct_metrics import DirectMetrics
from apache_beam.runners.runner import PipelineResult, PipelineState
from apache_beam.runners.worker import statesampler
from apache_beam.transforms import window
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils import counters
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_pipelines.engines import dask_primitives as primitives
from beam_pipelines.engines.beam_internals import new_output_handler, side_input_view_options

__all__ = [
    "DaskRunner",
    "DaskPipelineResult",
    "DEFAULT_PARTITIONS_PER_THREAD",
    "DEFAULT_RESHUFFLE_PARTITION_SIZE",
    "GROUP_INPUTS_PER_PARTITION",
    "even_partitions",
    "group_partition_count",
    "reshuffle_partition_count",
]

_LOGGER = logging.getLogger(__name__)

# Reshuffle targets this many partitions per worker thread when --dask_npartitions is not
# given: enough that a slow partition does not leave the other threads idle at the end.
DEFAULT_PARTITIONS_PER_THREAD = 4
# Elements per partition after a Reshuffle when --dask_partition_size is not given: the image
# step's elements are packed batches of 32 inputs (sources.RESHUFFLE_BATCH), so 4,096 images a
# task, whatever the number of images. Each step pays per task (and there are about 19 steps a
# partition): in a simulated build of 100 k images 128 took 226 CPU µs an image to 16's 367,
# and the larger worker's peak was no higher (343 MB to 353; 472 to 534 at 300 k images).
DEFAULT_RESHUFFLE_PARTITION_SIZE = 128

# A GroupByKey merges this many of its input partitions into one before its shuffle (at least
# DEFAULT_PARTITIONS_PER_THREAD per thread remain): after a Reshuffle, about 32 k images a
# group partition. The near-duplicate search's bucketed shuffle sends 18 entries an image.
GROUP_INPUTS_PER_PARTITION = 8

# Added to the priority of steps that only make side inputs (a step's own is its depth).
_SIDE_INPUT_PRIORITY = 1_000_000
_METRICS_TOPIC_PREFIX = "beam-metrics-"
# On a worker: every bundle's metrics, merged, per run (its topic), until the launcher takes
# them. One merged set per worker and run, however many tasks: Dask's event log, which carried
# one event per task, keeps only the last 1,000 of a topic (distributed.admin.
# low-level-log-length), so a build of more than about 1,000 tasks lost counts.
_HELD_METRICS: dict[str, MetricUpdates] = {}
_HELD_METRICS_LOCK = threading.Lock()
_METRIC_FIELDS = (
    "counters", "distributions", "gauges", "string_sets", "bounded_tries", "histograms"
)  # fmt: skip
# Beam's Create's partition size when no --dask_npartitions or --dask_partition_size is given.
_CREATE_PARTITION_SIZE = 128
_READ_BUNDLE_BYTES = 64 << 20
# DaskOptions' destinations that shape dask.bag partitions rather than the client.
_BAG_OPTIONS = ("npartitions", "partition_size")


# Every element is in the global window (the only one this runner supports): one windows
# tuple shared by all of them, instead of a new GlobalWindow per element and step.
_GLOBAL_WINDOWS = (window.GlobalWindow(),)


class _Partition(list):
    """A task's output: a list that Dask pickles whole when it moves between workers.

    Dask serialises a value of type exactly ``list`` element by element (a header and frames
    each: about 38 µs an element to send and 11 µs to receive); a subclass is one
    ``pickle.dumps`` of the whole partition (a few µs an element). Everything that reads a
    partition takes any sequence, so nothing else sees the difference.
    """

    __slots__ = ()


def _windowed_value(item: Any, window_fn: Any) -> WindowedValue:
    if isinstance(item, (WindowedValue, TimestampedValue, beam.pvalue.TaggedOutput)):
        return beam_eval.get_windowed_value(item, window_fn)
    return WindowedValue(item, MIN_TIMESTAMP, _GLOBAL_WINDOWS)


def _windowed(values: Iterable[Any], window_fn: Any) -> list[Any]:
    return [_windowed_value(v, window_fn) for v in values]


# DoFnSignature(fn) inspects every method of the DoFn (about 2 ms); each task deserialises its
# own copy of a step's DoFn, so a worker keeps the signature of the first copy it saw, per
# step, with no reference to that copy, and binds a shallow copy of it to each later one.
_SIGNATURES: dict[str, tuple[type, DoFnSignature]] = {}
_SIGNATURES_LOCK = threading.Lock()
_SIGNATURES_KEPT = 256
_BOUND_METHODS = (
    ("process_method", "process"),
    ("process_batch_method", "process_batch"),
    ("start_bundle_method", "start_bundle"),
    ("finish_bundle_method", "finish_bundle"),
    ("setup_lifecycle_method", "setup"),
    ("teardown_lifecycle_method", "teardown"),
)


def _bind_signature(template: DoFnSignature, fn: beam.DoFn | None) -> DoFnSignature:
    """A shallow copy of ``template`` whose methods are ``fn``'s (None: unbound)."""
    signature = copy.copy(template)
    signature.do_fn = fn  # type: ignore[assignment]  # None: a template no task runs
    for attr, name in _BOUND_METHODS:
        wrapper = copy.copy(getattr(template, attr))
        wrapper.method_value = getattr(fn, name) if fn is not None else None
        setattr(signature, attr, wrapper)
    return signature


def _signature(fn: beam.DoFn, step_key: str) -> DoFnSignature:
    """``DoFnSignature(fn)``, built once per ``step_key`` (a step of one run) in a process.

    Only for DoFns without state, timers or splitting (``_translate_pardo`` refuses those):
    their signature refers to the instance only through the methods bound here.
    """
    with _SIGNATURES_LOCK:
        kept = _SIGNATURES.get(step_key)
    if kept is not None and kept[0] is type(fn):
        return _bind_signature(kept[1], fn)
    signature = DoFnSignature(fn)
    with _SIGNATURES_LOCK:
        _SIGNATURES[step_key] = (type(fn), _bind_signature(signature, None))
        while len(_SIGNATURES) > _SIGNATURES_KEPT:
            del _SIGNATURES[next(iter(_SIGNATURES))]
    return signature


def _run_bundle(
    items: Iterable[Any],
    step_name: str,
    metrics_topic: str,
    fn: beam.DoFn,
    window_fn: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    side_specs: Sequence[tuple[Any, dict[str, Any], Any]],
    *side_values: list[Any],
) -> _Partition:
    """Runs one DoFn over one Dask partition (a Beam bundle) and returns its outputs.

    Receivers and the invoker are built here, inside the task, so that no state is shared
    between partitions that a worker deserialised from the same graph.
    """
    side_inputs = [
        SideInputMap(view_class, view_options, _windowed(values, mapping_fn))
        for (view_class, view_options, mapping_fn), values in zip(
            side_specs, side_values, strict=True
        )
    ]
    receivers = beam_eval.OneReceiver()
    handler = new_output_handler(window_fn, receivers)
    invoker = DoFnInvoker.create_invoker(
        _signature(fn, f"{metrics_topic}/{step_name}"),
        handler,
        context=DoFnContext(step_name, state=None),
        side_inputs=side_inputs or None,
        input_args=list(args),
        input_kwargs=kwargs,
        user_state_context=None,
        bundle_finalizer_param=beam.DoFn.BundleFinalizerParam(),
    )
    container = MetricsContainer(step_name)
    sampler = statesampler.StateSampler("", counters.CounterFactory())
    previous = statesampler.get_current_tracker()
    statesampler.set_current_tracker(sampler)
    try:
        with sampler.scoped_state(step_name, "process", metrics_container=container):
            invoker.invoke_setup()
            invoker.invoke_start_bundle()
            for item in items:
                invoker.invoke_process(_windowed_value(item, window_fn))
            invoker.invoke_finish_bundle()
            invoker.invoke_teardown()
    finally:
        statesampler.set_current_tracker(previous)
    _publish_metrics(metrics_topic, container)
    # Bags hold bare values, as the GroupByKey translation expects: in the global window a
    # WindowedValue carries nothing else the next step needs.
    return _Partition(
        [
            beam.pvalue.TaggedOutput(v.tag, v.value.value)
            if isinstance(v, beam.pvalue.TaggedOutput)
            else v.value
            for v in receivers.values
        ]
    )


def _publish_metrics(topic: str, container: MetricsContainer) -> None:
    """Adds a bundle's metrics to what this worker holds for the run (``_take_metrics``)."""
    updates = container.get_cumulative()
    if not any(getattr(updates, field) for field in _METRIC_FIELDS):
        return
    with _HELD_METRICS_LOCK:
        held = _HELD_METRICS.get(topic)
        _HELD_METRICS[topic] = updates if held is None else _merged(held, updates)


def _merged(held: MetricUpdates, more: MetricUpdates) -> MetricUpdates:
    """``held`` with ``more`` added: counters summed, sets joined, the rest combined."""
    for field in _METRIC_FIELDS:
        mine, theirs = getattr(held, field), getattr(more, field)
        for key, value in theirs.items():
            if key not in mine:
                mine[key] = value
            elif isinstance(value, int):
                mine[key] += value
            elif isinstance(value, (set, frozenset)):
                mine[key] = mine[key] | value
            else:
                mine[key] = mine[key].combine(value)
    return held


def _take_metrics(topic: str, clear: bool) -> bytes | None:
    """What this worker holds for the run, pickled; run on every worker by the launcher."""
    with _HELD_METRICS_LOCK:
        held = _HELD_METRICS.pop(topic, None) if clear else _HELD_METRICS.get(topic)
        return None if held is None else pickle.dumps(held)


def _select_tag(values: Iterable[Any], tag: str | None) -> _Partition:
    if tag is None:
        return _Partition([v for v in values if not isinstance(v, beam.pvalue.TaggedOutput)])
    return _Partition(
        [v.value for v in values if isinstance(v, beam.pvalue.TaggedOutput) and v.tag == tag]
    )


def _concat(*parts: Iterable[Any]) -> _Partition:
    return _Partition([v for part in parts for v in part])


def _group_key(item: tuple[Any, Any]) -> Any:
    return item[0]


def _grouped(groups: Iterable[tuple[Any, list[Any]]]) -> _Partition:
    """A ``GroupByKey``'s partition: ``(key, values)`` from Dask's ``(key, [(key, value)])``."""
    return _Partition([(key, [item[1] for item in items]) for key, items in groups])


def _drain(values: Iterable[Any]) -> list[int]:
    # Sinks are computed for their side effects; only a count travels back to the client.
    return [sum(1 for _ in values)]


def _impulse(_: Any) -> _Partition:
    return _Partition([b""])


def _read_bundles(bundles: Iterable[Any]) -> _Partition:
    out = _Partition()
    for bundle in bundles:
        tracker = bundle.source.get_range_tracker(bundle.start_position, bundle.stop_position)
        out.extend(bundle.source.read(tracker))
    return out


def _length(values: Iterable[Any]) -> list[int]:
    return [sum(1 for _ in values)]


def _gather(pieces: Sequence[tuple[int, int, int]], *parts: Sequence[Any]) -> _Partition:
    """One new partition: ``parts[i][start:stop]`` for each ``(i, start, stop)`` in order."""
    lists = [p if isinstance(p, list) else list(p) for p in parts]
    return _Partition([v for i, start, stop in pieces for v in lists[i][start:stop]])


def even_partitions(lengths: Sequence[int], count: int) -> list[list[tuple[int, int, int]]]:
    """Cuts partitions of ``lengths`` elements into ``count`` runs of nearly equal length.

    Returns, for each new partition, its pieces ``(old partition, start, stop)`` in element
    order: the new partitions' sizes differ by at most one and keep the elements' order.
    """
    total = sum(lengths)
    plan: list[list[tuple[int, int, int]]] = []
    i, used = 0, 0  # the old partition being cut, and how much of it is taken already
    for j in range(count):
        want = total * (j + 1) // count - total * j // count
        pieces = []
        while want > 0:
            take = min(want, lengths[i] - used)
            if take > 0:
                pieces.append((i, used, used + take))
                used += take
                want -= take
            if used == lengths[i]:
                i, used = i + 1, 0
        plan.append(pieces)
    return plan


def group_partition_count(inputs: int, *, minimum: int) -> int:
    """Partitions a ``GroupByKey`` of ``inputs`` partitions is shuffled into: one for every
    ``GROUP_INPUTS_PER_PARTITION`` of them, and at least ``minimum`` (or ``inputs``, if fewer).

    Each then holds about as many elements as that many input partitions, whatever the data:
    a fixed count would make each hold a fixed share of everything. Merging first keeps Dask's
    task shuffle small (``k ** s`` partitions in ``s`` stages of ``k + 2`` tasks each, ``k`` at
    most 32): 31 partitions are one stage of 1,000 tasks; 244 unmerged, two of 9,000."""
    return max(1, min(inputs, max(minimum, math.ceil(inputs / GROUP_INPUTS_PER_PARTITION))))


def reshuffle_partition_count(total: int, *, minimum: int, size: int) -> int:
    """Partitions after a ``Reshuffle`` of ``total`` elements: ``size`` elements each, and at
    least ``minimum`` (one per element if there are fewer)."""
    return max(1, min(total, max(minimum, math.ceil(total / size))))


class _LiftCombinePerKey(PTransformOverride):
    """``CombinePerKey`` as Beam's ``LiftedCombinePerKey``: a partial combine per key in each
    bundle, a ``GroupByKey`` of the accumulators, then a merge. Beam's portable runners lift
    combiners the same way; without it every input element would cross the shuffle."""

    def matches(self, applied_ptransform: AppliedPTransform) -> bool:
        return type(applied_ptransform.transform) is beam.CombinePerKey

    def get_replacement_transform_for_applied_ptransform(
        self, applied_ptransform: AppliedPTransform
    ) -> beam.PTransform:
        from apache_beam.transforms.combiners import LiftedCombinePerKey

        transform: Any = applied_ptransform.transform
        return LiftedCombinePerKey(transform.fn, transform.args, transform.kwargs)


class _ConsumerCounter(PipelineVisitor):
    """Counts the steps that read each PCollection, as a main or side input, and finds the
    PCollections read only on the way to side inputs (``side_only``)."""

    def __init__(self) -> None:
        self.consumers: dict[pvalue.PValue, int] = {}
        self._readers: dict[pvalue.PValue, list[AppliedPTransform]] = {}
        self._side_read: set[pvalue.PValue] = set()

    def visit_transform(self, node: AppliedPTransform) -> None:
        for pcoll in node.main_inputs.values():
            self.consumers[pcoll] = self.consumers.get(pcoll, 0) + 1
            self._readers.setdefault(pcoll, []).append(node)
        for side in node.side_inputs:
            self.consumers[side.pvalue] = self.consumers.get(side.pvalue, 0) + 1
            self._side_read.add(side.pvalue)

    def side_only(self) -> set[pvalue.PValue]:
        """PCollections every use of which ends in a side input: what a side input is made
        from, and nothing else reads."""
        found: dict[pvalue.PValue, bool] = {}

        def side_only(pcoll: pvalue.PValue) -> bool:
            if pcoll not in found:
                readers = self._readers.get(pcoll, [])
                outputs = [o for r in readers for o in r.outputs.values()]
                if not readers:
                    found[pcoll] = pcoll in self._side_read
                else:
                    found[pcoll] = all(side_only(o) for o in outputs)
            return found[pcoll]

        return {p for p in [*self._readers, *self._side_read] if side_only(p)}


class _BagTranslator(PipelineVisitor):
    """Builds one ``dask.bag.Bag`` per PCollection of a pipeline already rewritten by
    ``dask_primitives.primitive_overrides``."""

    def __init__(
        self,
        bag_kwargs: dict[str, Any],
        reshuffle_partitions: int,
        metrics_topic: str,
        *,
        client: Any = None,
        consumers: dict[pvalue.PValue, int] | None = None,
        side_only: set[pvalue.PValue] | None = None,
    ):
        self._bag_kwargs = bag_kwargs
        self._side_only = side_only or set()
        self._reshuffle_partitions = reshuffle_partitions
        self._metrics_topic = metrics_topic
        self._bags: dict[pvalue.PCollection, Any] = {}
        self._depth: dict[pvalue.PValue, int] = {}
        self._consumed: set[pvalue.PValue] = set()
        # With a client, a Reshuffle counts its input on the cluster first (_spread); the
        # steps still to visit that read each PCollection say what must be kept for later.
        self._client = client
        self._unvisited = dict(consumers or {})
        self._total_consumers = dict(consumers or {})

    def sink_bags(self) -> list[Any]:
        """Returns the bags of PCollections nothing consumes: computing them runs everything."""
        return [bag for pcoll, bag in self._bags.items() if pcoll not in self._consumed]

    def visit_transform(self, node: AppliedPTransform) -> None:
        for pcoll in list(node.main_inputs.values()):
            self._consumed.add(pcoll)
            self._unvisited[pcoll] = self._unvisited.get(pcoll, 1) - 1
        for side in node.side_inputs:
            self._consumed.add(side.pvalue)
            self._unvisited[side.pvalue] = self._unvisited.get(side.pvalue, 1) - 1
        import dask

        # A step's tasks outrank those of every step it reads: whenever a partition's readers
        # can run, they run before the next partition is made, which it then frees.
        inputs = [*node.main_inputs.values(), *(side.pvalue for side in node.side_inputs)]
        depth = 1 + max((self._depth.get(p, 0) for p in inputs), default=0)
        outputs = [o for o in node.outputs.values() if isinstance(o, pvalue.PCollection)]
        # Steps that only make side inputs outrank all others: what waits for a side input
        # cannot run at all before it, and its upstream would pile up meanwhile.
        boost = (
            _SIDE_INPUT_PRIORITY if outputs and all(o in self._side_only for o in outputs) else 0
        )
        with dask.annotate(priority=depth + boost):
            out = self._translate(node)
            for tag, output in node.outputs.items():
                if not isinstance(output, pvalue.PCollection):
                    continue
                self._depth[output] = depth
                if isinstance(node.transform, beam.ParDo) and len(node.outputs) > 1:
                    self._bags[output] = out.map_partitions(_select_tag, tag)
                else:
                    self._bags[output] = out

    def _input_bags(self, node: AppliedPTransform) -> list[Any]:
        return [
            self._bags[p] for p in node.main_inputs.values() if isinstance(p, pvalue.PCollection)
        ]

    def _translate(self, node: AppliedPTransform) -> Any:
        import dask.bag as db

        transform = node.transform
        if isinstance(transform, primitives.CreateValues):
            return db.from_sequence(transform.values, **self._create_kwargs(transform))
        if isinstance(transform, beam.Impulse):
            return db.from_sequence([None], npartitions=1).map_partitions(_impulse)
        if isinstance(transform, primitives.ReadSource):
            # Splitting on the client is how Beam's own runners start a bounded read; each
            # bundle then becomes one partition, read on whichever worker takes it.
            source: Any = transform.source  # a BoundedSource: Beam types it as SourceBase
            bundles = list(source.split(desired_bundle_size=_READ_BUNDLE_BYTES))
            return db.from_sequence(bundles, npartitions=max(1, len(bundles))).map_partitions(
                _read_bundles
            )
        if isinstance(transform, primitives.ReshuffleElements):
            (pcoll,) = node.main_inputs.values()
            assert isinstance(pcoll, pvalue.PCollection)
            return self._spread(pcoll)
        if isinstance(transform, primitives.GroupByKeyGlobally):
            (bag,) = self._input_bags(node)
            count = self._bag_kwargs.get("npartitions") or group_partition_count(
                bag.npartitions, minimum=self._reshuffle_partitions
            )
            if bag.npartitions > count:
                bag = bag.repartition(npartitions=count)
            # Dask's groupby (a task shuffle), with partitions that cross workers whole.
            return bag.groupby(_group_key).map_partitions(_grouped)
        if isinstance(transform, primitives.FlattenInputs):
            bags = self._input_bags(node)
            return db.concat(bags) if bags else db.from_sequence([], npartitions=1)
        if isinstance(transform, beam.WindowInto):
            windowfn = transform.windowing.windowfn
            if not isinstance(windowfn, window.GlobalWindows):
                raise NotImplementedError(
                    f"DaskRunner supports only the global window; step {node.full_label!r} "
                    f"uses {windowfn!r}"
                )
            (bag,) = self._input_bags(node)
            return bag
        if type(transform) is beam.ParDo:
            return self._translate_pardo(node)
        raise NotImplementedError(
            f"DaskRunner cannot run step {node.full_label!r}: primitive "
            f"{type(transform).__module__}.{type(transform).__qualname__} is not supported"
        )

    def _create_kwargs(self, transform: Any) -> dict[str, Any]:
        # Beam's Create picks this same size when given none, with a warning on every run.
        if self._bag_kwargs.get("npartitions") or self._bag_kwargs.get("partition_size"):
            return self._bag_kwargs
        size = max(_CREATE_PARTITION_SIZE, math.ceil(math.sqrt(len(transform.values)) / 10))
        return {**self._bag_kwargs, "partition_size": size}

    def _spread(self, pcoll: pvalue.PCollection) -> Any:
        """A ``Reshuffle`` of ``pcoll``: its elements spread evenly over partitions of bounded
        size, or over the fixed count of the partitions it had without a client."""
        import dask
        import dask.bag as db

        bag = self._bags[pcoll]
        if self._client is None:
            return bag.repartition(npartitions=self._reshuffle_partitions)
        # Everything translated so far that a later step, or nobody, reads is computed now, in
        # one graph, and kept on the workers: no task upstream of here runs twice.
        kept = [
            p
            for p in self._bags
            if p is pcoll or self._unvisited.get(p, 0) > 0 or self._total_consumers.get(p, 0) == 0
        ]
        persisted = self._client.persist([self._bags[p] for p in kept])
        for p, persisted_bag in zip(kept, persisted, strict=True):
            self._bags[p] = persisted_bag
        bag = self._bags[pcoll]
        lengths = self._client.compute(bag.map_partitions(_length)).result()
        size = self._bag_kwargs.get("partition_size") or DEFAULT_RESHUFFLE_PARTITION_SIZE
        count = self._bag_kwargs.get("npartitions") or reshuffle_partition_count(
            sum(lengths), minimum=self._reshuffle_partitions, size=size
        )
        parts = bag.to_delayed(optimize_graph=False)
        spread = []
        for pieces in even_partitions(lengths, count):
            used = sorted({i for i, _, _ in pieces})
            position = {i: k for k, i in enumerate(used)}
            local = [(position[i], start, stop) for i, start, stop in pieces]
            spread.append(dask.delayed(_gather)(local, *(parts[i] for i in used)))
        return db.from_delayed(spread)

    def _translate_pardo(self, node: AppliedPTransform) -> Any:
        import dask
        import dask.bag as db

        transform: Any = node.transform  # a ParDo: _translate checked its type
        signature = DoFnSignature(transform.fn)
        if signature.is_stateful_dofn() or signature.is_splittable_dofn():
            raise NotImplementedError(
                f"DaskRunner cannot run step {node.full_label!r}: "
                f"{type(transform.fn).__qualname__} uses state, timers or splitting"
            )
        (bag,) = self._input_bags(node)
        main_input = next(iter(node.main_inputs.values()), None)
        windowing = getattr(main_input, "windowing", None)
        window_fn = windowing.windowfn if windowing is not None else None
        args, kwargs = transform.raw_side_inputs
        side_specs = []
        side_values = []
        for side in node.side_inputs:
            # The side input's values are windowed as its PCollection is (always globally).
            windowfn = side.pvalue.windowing.windowfn
            side_specs.append((type(side), side_input_view_options(side), windowfn))
            # One delayed list per side input: a real graph dependency, computed once. Its
            # partitions are passed as separate arguments: Dask culls the graph of a list of
            # Delayed values again for each call (1.5 s each on a graph of 60 x 400 tasks).
            side_bag: db.Bag = self._bags[side.pvalue]
            side_values.append(dask.delayed(_concat)(*side_bag.to_delayed(optimize_graph=False)))
        return bag.map_partitions(
            _run_bundle,
            node.full_label,
            self._metrics_topic,
            transform.fn,
            window_fn,
            list(args),
            dict(kwargs),
            side_specs,
            *side_values,
        )


class DaskPipelineResult(PipelineResult):
    """The result of a pipeline submitted to a Dask cluster.

    ``wait_until_finish`` raises the first task error, collects the Beam metrics the workers
    published, and closes the client the runner opened.
    """

    def __init__(self, client: Any, futures: Sequence[Any], metrics_topic: str):
        super().__init__(PipelineState.RUNNING)
        self.client = client
        self.futures = list(futures)
        self._metrics_topic = metrics_topic
        self._metrics: DirectMetrics | None = None

    def wait_until_finish(self, duration: int | None = None) -> str:
        """Blocks until every sink is computed.

        Args:
            duration: Milliseconds to wait, or None to wait until the pipeline ends.

        Returns:
            The final ``PipelineState``.

        Raises:
            Exception: The first error a task raised (the pipeline is then FAILED), or a
                timeout error from Dask if ``duration`` elapsed first.
        """
        import dask.distributed as ddist

        if self._state in (PipelineState.DONE, PipelineState.FAILED, PipelineState.CANCELLED):
            return self._state
        timeout = duration / 1000 if duration is not None else None
        try:
            for _ in ddist.as_completed(self.futures, timeout=timeout, with_results=True):
                pass
        except ddist.TimeoutError:
            raise
        except KeyboardInterrupt:
            # Ctrl-C or SIGTERM in the launcher: the job ends with it, not on the cluster alone.
            self.cancel()
            raise
        except BaseException:
            self._state = PipelineState.FAILED
            self._close()
            raise
        self._state = PipelineState.DONE
        self._close()
        return self._state

    def cancel(self) -> str:
        """Cancels every outstanding task and closes the client.

        Tasks not yet started never start; a task already running on a worker finishes its
        partition (Dask cannot stop a running thread) and its result is dropped.
        """
        if self._state in (PipelineState.DONE, PipelineState.FAILED, PipelineState.CANCELLED):
            return self._state
        self._state = PipelineState.CANCELLING
        self.client.cancel(self.futures, force=True)
        self._close()
        self._state = PipelineState.CANCELLED
        return self._state

    def metrics(self) -> DirectMetrics:
        """Returns the Beam metrics the workers' bundles reported (final once DONE)."""
        if self._metrics is None:
            return self._collect_metrics()
        return self._metrics

    def _collect_metrics(self, clear: bool = False) -> DirectMetrics:
        metrics = DirectMetrics()
        held = self.client.run(_take_metrics, self._metrics_topic, clear)
        for payload in held.values():
            if payload is not None:
                updates = pickle.loads(payload)
                metrics.commit_logical(None, updates)
                metrics.commit_physical(None, updates)
        return metrics

    def _close(self) -> None:
        if self._metrics is None:
            try:
                self._metrics = self._collect_metrics(clear=True)
            except Exception:  # the scheduler may be gone after a failure
                _LOGGER.warning("Could not collect metrics from the Dask scheduler", exc_info=True)
                self._metrics = DirectMetrics()
        self.client.close()


class DaskRunner(beam_dask.DaskRunner):
    """Runs a batch Beam pipeline on a Dask cluster, every branch of it.

    Accepts Beam's Dask options unchanged: ``--dask_client_address`` (a running scheduler; a
    ``LocalCluster`` when absent), ``--dask_scheduler_file``, ``--dask_connection_timeout``,
    ``--dask_npartitions`` (also the partition count after each ``Reshuffle`` and
    ``GroupByKey``; by default a ``Reshuffle`` makes partitions of
    ``DEFAULT_RESHUFFLE_PARTITION_SIZE`` elements and a ``GroupByKey`` one partition for every
    ``GROUP_INPUTS_PER_PARTITION`` of its input's, at least ``DEFAULT_PARTITIONS_PER_THREAD``
    per worker thread). Workers must be able to import the
    pipeline's package, like any Beam worker.
    """

    def run_pipeline(self, pipeline: beam.Pipeline, options: Any) -> DaskPipelineResult:
        import dask.distributed as ddist

        view = options.view_as(beam_dask.DaskOptions)
        # The options' destinations are dask.distributed.Client's keywords (Beam's own
        # DaskOptionsTest checks that), except the two that shape partitions.
        bag_kwargs = {k: getattr(view, k) for k in _BAG_OPTIONS if getattr(view, k, None)}
        dask_options = {
            k: v
            for k, v in view.get_all_options(drop_default=True, current_only=True).items()
            if k not in _BAG_OPTIONS
        }
        if not dask_options.get("address") and not dask_options.get("scheduler_file"):
            # A local cluster's scheduler and nannies live in this process, and distributed
            # logs their start and every step of their shutdown at INFO (its own default).
            logging.getLogger("distributed").setLevel(logging.WARNING)
        client = ddist.Client(**dask_options)
        try:
            # Lifted first: the GroupByKey it expands to is then replaced like any other.
            pipeline.replace_all([_LiftCombinePerKey(), *primitives.primitive_overrides()])
            partitions = bag_kwargs.get("npartitions") or self._default_partitions(client)
            topic = f"{_METRICS_TOPIC_PREFIX}{uuid.uuid4().hex}"
            counter = _ConsumerCounter()
            pipeline.visit(counter)
            translator = _BagTranslator(
                bag_kwargs,
                partitions,
                topic,
                client=client,
                consumers=counter.consumers,
                side_only=counter.side_only(),
            )
            pipeline.visit(translator)
            sinks = [bag.map_partitions(_drain) for bag in translator.sink_bags()]
            # Unoptimised: Dask's fusion of linear chains drops the layers' priorities.
            futures = client.compute(sinks, optimize_graph=False)
            del translator, sinks  # what a Reshuffle kept goes once its readers are done
        except BaseException:
            client.close()
            raise
        return DaskPipelineResult(client, futures, topic)

    @staticmethod
    def _default_partitions(client: Any) -> int:
        threads = sum(client.nthreads().values())
        return max(1, threads) * DEFAULT_PARTITIONS_PER_THREAD

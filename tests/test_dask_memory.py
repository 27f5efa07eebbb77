"""What a Dask worker holds does not grow with the data: a ``Reshuffle`` cuts its input into
partitions of bounded size (a worker keeps a task's whole output until its readers are done),
combines are lifted (one accumulator per key and partition crosses the shuffle, not every
element), and what precedes a ``Reshuffle``, which is computed first to count it, runs once.

The builds themselves are checked byte-identical to the in-process runner in test_engines.py;
``python -m benchmarks.bench_scale memory --modes dask`` measures the memory.
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from beam_pipelines.engines.dask_runner import (
    DEFAULT_RESHUFFLE_PARTITION_SIZE,
    even_partitions,
    reshuffle_partition_count,
)
from beam_pipelines.engines.runners import resolve_runner_aliases

_N = 40 * DEFAULT_RESHUFFLE_PARTITION_SIZE


def _options(cluster, *extra: str) -> PipelineOptions:
    return PipelineOptions(resolve_runner_aliases([*cluster.runner_args(), *extra]))


@pytest.mark.parametrize(
    ("lengths", "count"),
    [([0, 5, 0, 3], 3), ([10], 4), ([7, 0, 0, 9, 1], 17), ([0, 0], 1), ([4, 4], 8)],
)
def test_even_partitions_keep_every_element_in_order_in_near_equal_runs(lengths, count):
    plan = even_partitions(lengths, count)
    taken = [(i, k) for pieces in plan for i, start, stop in pieces for k in range(start, stop)]
    assert taken == [(i, k) for i, n in enumerate(lengths) for k in range(n)]
    sizes = [sum(stop - start for _, start, stop in pieces) for pieces in plan]
    assert len(sizes) == count and max(sizes) - min(sizes) <= 1


def test_reshuffle_partitions_grow_with_the_elements_not_their_size():
    assert reshuffle_partition_count(0, minimum=8, size=16) == 1
    assert reshuffle_partition_count(3, minimum=8, size=16) == 3
    assert reshuffle_partition_count(40, minimum=8, size=16) == 8
    assert reshuffle_partition_count(16_000, minimum=8, size=16) == 1_000


@pytest.mark.slow
def test_dask_reshuffle_bounds_bundles_and_runs_what_precedes_it_once(dask_cluster):
    # Defined here so that they travel to the workers by value (the workers cannot import
    # this module).
    class _Tag(beam.DoFn):
        def __init__(self):
            self._runs = Metrics.counter("dask_memory_test", "upstream")

        def process(self, x):
            self._runs.inc()
            if x % 7 == 0:
                yield beam.pvalue.TaggedOutput("sevens", x)
            yield x

    class _BundleSize(beam.DoFn):
        def start_bundle(self):
            self._n = 0

        def process(self, x):
            self._n += 1

        def finish_bundle(self):
            yield window.GlobalWindows.windowed_value(self._n)

    pipeline = beam.Pipeline(options=_options(dask_cluster))
    # One Create partition of every element: the partitioning a listing step also gives.
    numbers = (
        pipeline
        | beam.Create([list(range(_N))])
        | "Expand" >> beam.FlatMap(lambda xs: xs)
        | "Tag" >> beam.ParDo(_Tag()).with_outputs("sevens", main="all")
    )
    # Read both before and after the Reshuffle: each upstream task must still run once.
    assert_that(numbers.sevens, equal_to(list(range(0, _N, 7))), label="Sevens")
    spread = numbers.all | "Spread" >> beam.Reshuffle()
    sizes = spread | "BundleSizes" >> beam.ParDo(_BundleSize())
    assert_that(
        sizes | "Collect" >> beam.combiners.ToList(),
        equal_to([[DEFAULT_RESHUFFLE_PARTITION_SIZE] * (_N // DEFAULT_RESHUFFLE_PARTITION_SIZE)]),
        label="EvenBundles",
    )
    result = pipeline.run()
    assert result.wait_until_finish() == "DONE"
    query = result.metrics().query(MetricsFilter().with_namespace("dask_memory_test"))
    (runs,) = query["counters"]
    assert runs.committed == _N


@pytest.mark.slow
def test_dask_combines_are_lifted(dask_cluster):
    class _LongestRun(beam.CombineFn):
        """The sum, and the most inputs any one accumulator took through ``add_input``."""

        def create_accumulator(self):
            return 0, 0

        def add_input(self, acc, x):
            return acc[0] + x, acc[1] + 1

        def merge_accumulators(self, accs):
            accs = list(accs)
            return sum(a[0] for a in accs), max(a[1] for a in accs)

        def extract_output(self, acc):
            return acc

    pipeline = beam.Pipeline(options=_options(dask_cluster))
    combined = (
        pipeline
        | beam.Create([list(range(_N))])
        | "Expand" >> beam.FlatMap(lambda xs: xs)
        | "Spread" >> beam.Reshuffle()
        | beam.CombineGlobally(_LongestRun())
    )
    # Lifted: each partition is combined where it lies, so no accumulator takes more than a
    # partition; unlifted, one task adds every element (a third of them per accumulator).
    assert_that(
        combined,
        equal_to([(sum(range(_N)), DEFAULT_RESHUFFLE_PARTITION_SIZE)]),
        label="Lifted",
    )
    assert pipeline.run().wait_until_finish() == "DONE"

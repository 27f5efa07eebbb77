"""The pipeline on distributed engines: a Dask cluster of worker processes and Beam's portable
runner with LOOPBACK SDK workers (the multi-process DirectRunner is in test_pipeline.py).

Every engine must write byte-identical shards, reports and ``dataset.json`` to those of the
in-process DirectRunner. The DaskRunner is also checked on small pipelines for the things
Beam's own DaskRunner gets wrong (unrun branches, mixed tagged outputs, one-partition
Reshuffle, lost ``finish_bundle`` output, missing metrics).
"""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pvalue import AsSingleton
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from beam_pipelines.engines.dask_runner import DaskRunner
from beam_pipelines.engines.runners import (
    DASK_RUNNER,
    RUNNER_ALIASES,
    InProcessRunner,
    in_process_runner,
    resolve_runner_aliases,
)
from beam_pipelines.images_to_tfrecord import JobFailedError, run
from schemas.manifest import MANIFEST_NAME
from schemas.shard_table import decode_manifest
from tests.fixtures.images import make_bad_files, make_image_tree, png_bytes
from tests.fixtures.processes import free_ports

# Fewer shards than splits x workers would hide ordering bugs; more would only cost time.
_PIPELINE_FLAGS = [
    "--validation_fraction",
    "0.25",
    "--num_shards",
    "4",
    "--max_bad_fraction",
    "0.5",
]


# ---------------------------------------------------------------------------------------------
# Runner names and options


def test_dask_short_name_and_beam_class_path_select_the_corrected_runner():
    assert RUNNER_ALIASES["DaskRunner"] == DASK_RUNNER
    assert resolve_runner_aliases(["--runner", "DaskRunner"]) == ["--runner", DASK_RUNNER]
    assert resolve_runner_aliases(
        ["--runner=apache_beam.runners.dask.dask_runner.DaskRunner", "--x"]
    ) == [f"--runner={DASK_RUNNER}", "--x"]
    assert resolve_runner_aliases(["--runner", "DataflowRunner", "--project", "p"]) == [
        "--runner",
        "DataflowRunner",
        "--project",
        "p",
    ]


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--runner", "DirectRunner"],
        ["--runner=direct"],
        ["--runner", "apache_beam.runners.direct.direct_runner.DirectRunner"],
    ],
)
def test_the_direct_runner_default_runs_in_process_without_trying_prism(argv):
    assert isinstance(in_process_runner(PipelineOptions(argv)), InProcessRunner)


@pytest.mark.parametrize(
    "argv",
    [
        ["--runner", DASK_RUNNER],
        ["--runner", "PrismRunner"],
        ["--runner", "PortableRunner"],
        ["--runner", "apache_beam.runners.direct.direct_runner.SwitchingDirectRunner"],
        ["--streaming"],
    ],
)
def test_any_other_runner_or_a_streaming_job_is_left_to_the_runner_flag(argv):
    assert in_process_runner(PipelineOptions(argv)) is None


def test_an_in_process_run_never_starts_prism(engine_input, tmp_path, caplog):
    caplog.set_level("INFO", logger="apache_beam.runners.direct.direct_runner")
    summary = run(["--input", str(engine_input), "--output", str(tmp_path), *_PIPELINE_FLAGS])
    assert summary.published
    assert summary.metrics["images_written"] == 18
    assert not [r for r in caplog.records if "Prism" in r.getMessage()]


@pytest.mark.parametrize(
    "address", ["tcp://127.0.0.1:8786", "127.0.0.1:8786", "tls://scheduler.internal:8786"]
)
def test_dask_client_address_accepts_scheduler_addresses(address):
    argv = ["--runner", "DaskRunner", "--dask_client_address", address]
    assert resolve_runner_aliases(argv)[-1] == address


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runner", "DaskRunner", "--dask_client_address", "localhost"], "'localhost'"),
        (["--runner", "DaskRunner", "--dask_client_address=tcp://h:99999"], "'tcp://h:99999'"),
        (["--runner", "DaskRunner", "--dask_client_address", "http://h:80"], "'http://h:80'"),
        (["--dask_client_address", "127.0.0.1:8786"], "'DirectRunner'"),
        (
            ["--runner", "PortableRunner", "--dask_npartitions", "8"],
            "--dask_npartitions can only be used with --runner DaskRunner",
        ),
        (
            [
                "--runner",
                "DaskRunner",
                "--dask_client_address",
                "127.0.0.1:1",
                "--dask_scheduler_file",
                "s.json",
            ],
            "give one",
        ),
        (["--input", "x", "--runner"], "--runner needs a value"),
    ],
)
def test_bad_runner_options_are_refused_naming_the_value(argv, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        resolve_runner_aliases(argv)


# ---------------------------------------------------------------------------------------------
# The DaskRunner on small pipelines


def _dask_options(cluster, *extra: str) -> PipelineOptions:
    return PipelineOptions(resolve_runner_aliases([*cluster.runner_args(), *extra]))


def _executed_tasks(cluster) -> dict[str, int]:
    from distributed import Client

    with Client(cluster.address) as client:
        return client.run(lambda dask_worker: dask_worker.state.executed_count)


@pytest.mark.slow
def test_dask_runs_every_branch_with_tags_side_inputs_and_metrics(dask_cluster, tmp_path):
    # Defined here, not at module level, so that it travels to the workers by value: neither
    # the scheduler nor the workers can import this test module.
    class _SplitEvenOdd(beam.DoFn):
        def __init__(self):
            self._seen = Metrics.counter("engines_test", "seen")
            self._sizes = Metrics.distribution("engines_test", "value")

        def start_bundle(self):
            self._count = 0

        def process(self, x):
            self._seen.inc()
            self._sizes.update(x)
            self._count += 1
            if x % 2:
                yield beam.pvalue.TaggedOutput("odd", x)
            else:
                yield x

        def finish_bundle(self):
            # One summary per bundle, emitted where Beam's own DaskRunner dropped outputs.
            yield window.GlobalWindows.windowed_value(("bundle", self._count))

    numbers = list(range(40))
    pipeline = beam.Pipeline(options=_dask_options(dask_cluster))
    spread = pipeline | beam.Create(numbers) | "Spread" >> beam.Reshuffle()
    split = spread | "Split" >> beam.ParDo(_SplitEvenOdd()).with_outputs("odd", main="even")
    total = split.odd | "SumOdd" >> beam.CombineGlobally(sum)
    evens = split.even | "OnlyNumbers" >> beam.Filter(lambda x: isinstance(x, int))
    bundles = split.even | "OnlyBundles" >> beam.Filter(lambda x: isinstance(x, tuple))
    assert_that(evens, equal_to([n for n in numbers if n % 2 == 0]), label="Evens")
    assert_that(split.odd, equal_to([n for n in numbers if n % 2]), label="Odds")
    assert_that(total, equal_to([sum(n for n in numbers if n % 2)]), label="OddTotal")
    with_side = (
        pipeline
        | "One" >> beam.Create([None])
        | "AddTotal" >> beam.Map(lambda _, t: t + 1, beam.pvalue.AsSingleton(total))
    )
    assert_that(with_side, equal_to([sum(n for n in numbers if n % 2) + 1]), label="SideInput")
    lines = [f"line {i}" for i in range(25)]
    text = tmp_path / "lines.txt"
    text.write_text("\n".join(lines) + "\n")
    # A bounded source (Read), which Beam's own DaskRunner cannot run at all.
    assert_that(pipeline | beam.io.ReadFromText(str(text)), equal_to(lines), label="Text")
    bundle_sizes = bundles | "BundleSizes" >> beam.combiners.ToList()
    # After the Reshuffle the 40 elements are spread over several bundles (partitions), and
    # every bundle's finish_bundle output arrives.
    assert_that(
        bundle_sizes | beam.Map(lambda bs: (len(bs) > 1, sum(n for _, n in bs))),
        equal_to([(True, len(numbers))]),
        label="Bundles",
    )
    before = _executed_tasks(dask_cluster)
    result = pipeline.run()
    assert result.wait_until_finish() == "DONE"
    after = _executed_tasks(dask_cluster)
    assert all(after[w] > before.get(w, 0) for w in after), (before, after)

    query = result.metrics().query(MetricsFilter().with_namespace("engines_test"))
    (seen,) = query["counters"]
    assert seen.key.step.startswith("Split") and seen.committed == len(numbers)
    (values,) = query["distributions"]
    assert (values.committed.count, values.committed.sum) == (len(numbers), sum(numbers))


@pytest.mark.slow
def test_a_local_dask_cluster_starts_and_stops_without_info_lines():
    # No address: the runner starts a local cluster, whose scheduler and nannies log in this
    # process; distributed logs each step of their start and shutdown at INFO by default.
    import logging

    class _Records(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record):
            self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")

    records = _Records()
    distributed_logger = logging.getLogger("distributed")
    distributed_logger.setLevel(logging.INFO)
    distributed_logger.addHandler(records)
    try:
        options = PipelineOptions(resolve_runner_aliases(["--runner", "DaskRunner"]))
        with beam.Pipeline(options=options) as pipeline:
            doubled = pipeline | beam.Create([1, 2, 3]) | beam.Map(lambda x: 2 * x)
            assert_that(doubled, equal_to([2, 4, 6]))
    finally:
        distributed_logger.removeHandler(records)
    assert not [line for line in records.lines if line.startswith("INFO")], records.lines


@pytest.mark.slow
def test_dask_failure_in_a_worker_fails_the_pipeline(dask_cluster):
    def explode(x):
        if x == 3:
            raise ValueError(f"bad element {x}")
        return x

    pipeline = beam.Pipeline(options=_dask_options(dask_cluster))
    _ = pipeline | beam.Create(range(5)) | beam.Map(explode)
    result = pipeline.run()
    with pytest.raises(ValueError, match="bad element 3"):
        result.wait_until_finish()
    assert result.state == "FAILED"


@pytest.mark.slow
def test_dask_refuses_non_global_windows_naming_the_step(dask_cluster):
    pipeline = beam.Pipeline(options=_dask_options(dask_cluster))
    _ = (
        pipeline
        | beam.Create([1, 2])
        | "Hourly" >> beam.WindowInto(window.FixedWindows(3600))
        | beam.GroupBy(lambda x: x)
    )
    with pytest.raises(NotImplementedError, match="'Hourly'.*FixedWindows"):
        pipeline.run()


@pytest.mark.slow
def test_dask_refuses_stateful_dofns_naming_the_step(dask_cluster):
    from apache_beam.coders import VarIntCoder
    from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

    class _Running(beam.DoFn):
        TOTAL = ReadModifyWriteStateSpec("total", VarIntCoder())

        def process(self, kv, total=beam.DoFn.StateParam(TOTAL)):  # noqa: B008  (Beam API)
            total.write((total.read() or 0) + kv[1])
            yield total.read()

    pipeline = beam.Pipeline(options=_dask_options(dask_cluster))
    _ = pipeline | beam.Create([("a", 1), ("a", 2)]) | "Running" >> beam.ParDo(_Running())
    with pytest.raises(NotImplementedError, match="'Running'.*state"):
        pipeline.run()


def test_dask_runner_class_is_beams_dask_runner():
    from apache_beam.runners.dask.dask_runner import DaskRunner as BeamDaskRunner

    assert issubclass(DaskRunner, BeamDaskRunner)


def test_dask_bundles_run_each_tasks_own_copy_of_a_steps_dofn():
    # A worker builds a step's DoFnSignature once and binds it to every later task's own
    # (deserialised) copy of the DoFn, keeping no reference to the first copy.
    import gc
    import weakref

    from apache_beam.utils.timestamp import MIN_TIMESTAMP

    from beam_pipelines.engines import dask_runner

    class _Offset(beam.DoFn):
        def __init__(self, offset):
            self._offset = offset

        def start_bundle(self):
            self._count = 0

        def process(self, x, ts=beam.DoFn.TimestampParam, win=beam.DoFn.WindowParam):
            self._count += 1
            yield x + self._offset, ts, win

        def finish_bundle(self):
            yield window.GlobalWindows.windowed_value(("count", self._count))

    def bundle(fn, items):
        return dask_runner._run_bundle(items, "Offset", "topic-of-this-test", fn, None, [], {}, [])

    in_global = (MIN_TIMESTAMP, window.GlobalWindow())  # as the in-process runner gives them
    assert bundle(_Offset(1), [1, 2]) == [(2, *in_global), (3, *in_global), ("count", 2)]
    second = _Offset(100)
    assert bundle(second, [5]) == [(105, *in_global), ("count", 1)]
    assert bundle(_Offset(7), []) == [("count", 0)]
    copy = weakref.ref(second)
    del second
    gc.collect()
    assert copy() is None


@pytest.mark.slow
def test_dask_partitions_are_pickled_whole_and_arrive_unchanged(dask_cluster):
    # Dask sends a plain list element by element (a header and frames each); a partition is
    # one pickle, and what arrives on the other worker is the same elements.
    from distributed import Client
    from distributed.protocol import deserialize, serialize, to_serialize

    from beam_pipelines.engines import dask_runner

    elements = [(i, f"value {i}".encode(), {"k": [i / 2]}) for i in range(300)]
    part = dask_runner._concat(elements[:100], elements[100:])
    header, frames = serialize(to_serialize(part))
    assert len(frames) == 1
    assert deserialize(header, frames) == elements
    with Client(dask_cluster.address) as client:
        first, second = sorted(client.nthreads())
        made = client.submit(dask_runner._concat, elements, workers=[first], pure=False)
        arrived = client.submit(
            lambda p: (type(p).__name__, list(p)),
            made,
            workers=[second],
            allow_other_workers=False,
            pure=False,
        )
        assert arrived.result() == ("_Partition", elements)


@pytest.mark.slow
def test_dask_steps_of_one_dofn_class_keep_their_own_arguments_and_metrics(dask_cluster):
    class _Offset(beam.DoFn):
        def __init__(self, offset):
            self._offset = offset
            self._seen = Metrics.counter("engines_offsets", "seen")

        def process(self, x):
            self._seen.inc()
            yield x + self._offset

    numbers = list(range(200))
    pipeline = beam.Pipeline(options=_dask_options(dask_cluster))
    spread = pipeline | beam.Create(numbers) | "Spread" >> beam.Reshuffle()
    ones = spread | "PlusOne" >> beam.ParDo(_Offset(1))
    thousands = ones | "PlusThousand" >> beam.ParDo(_Offset(1000))
    doubled = thousands | "Double" >> beam.Map(lambda x: 2 * x)
    tripled = thousands | "Triple" >> beam.Map(lambda x: 3 * x)
    assert_that(doubled, equal_to([2 * (n + 1001) for n in numbers]), label="Doubled")
    assert_that(tripled, equal_to([3 * (n + 1001) for n in numbers]), label="Tripled")
    result = pipeline.run()
    assert result.wait_until_finish() == "DONE"
    query = result.metrics().query(MetricsFilter().with_namespace("engines_offsets"))
    seen = {c.key.step: c.committed for c in query["counters"]}
    assert seen == {"PlusOne": len(numbers), "PlusThousand": len(numbers)}


@pytest.mark.parametrize(
    ("inputs", "minimum", "expected"),
    [(1, 8, 1), (5, 8, 5), (8, 8, 8), (64, 8, 8), (65, 8, 9), (244, 8, 31), (2441, 8, 306)],
)
def test_dask_group_partitions_grow_with_the_input_partitions(inputs, minimum, expected):
    from beam_pipelines.engines.dask_runner import group_partition_count

    assert group_partition_count(inputs, minimum=minimum) == expected


@pytest.mark.slow
def test_dask_group_by_key_shuffles_into_partitions_that_grow_with_its_input(dask_cluster):
    # 256 partitions of 4 elements reach the GroupByKey: it shuffles them into 32 partitions
    # (one per 8), not the fixed per-thread count, so no group partition holds a fixed share
    # of all the data. Each group partition is one bundle of the step after it.
    class _Bundles(beam.DoFn):
        def __init__(self):
            self._bundles = Metrics.counter("engines_groups", "bundles")

        def start_bundle(self):
            self._bundles.inc()

        def process(self, kv):
            key, values = kv
            yield key, sorted(values)

    numbers = list(range(1024))
    options = _dask_options(dask_cluster, "--dask_partition_size", "4")
    pipeline = beam.Pipeline(options=options)
    grouped = (
        pipeline
        | beam.Create(numbers)
        | "Key" >> beam.Map(lambda n: (n % 100, n))
        | beam.GroupByKey()
        | "Bundles" >> beam.ParDo(_Bundles())
    )
    expected = [(k, [n for n in numbers if n % 100 == k]) for k in range(100)]
    assert_that(grouped, equal_to(expected))
    result = pipeline.run()
    assert result.wait_until_finish() == "DONE"
    query = result.metrics().query(MetricsFilter().with_namespace("engines_groups"))
    (bundles,) = query["counters"]
    assert bundles.committed == 32


@pytest.mark.slow
def test_dask_metrics_count_every_bundle_of_a_run_of_thousands_of_tasks(dask_cluster):
    # 1,500 bundles count their elements: more than the 1,000 events Dask's event log keeps
    # of a topic, which is how metrics travelled before (the counts then fell short).
    class _Seen(beam.DoFn):
        def __init__(self):
            self._seen = Metrics.counter("engines_many", "seen")
            self._sizes = Metrics.distribution("engines_many", "size")

        def process(self, x):
            self._seen.inc()
            self._sizes.update(x)
            yield x

    numbers = list(range(3000))
    options = _dask_options(dask_cluster, "--dask_partition_size", "2")
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | beam.Create(numbers) | "Seen" >> beam.ParDo(_Seen())
    result = pipeline.run()
    assert result.wait_until_finish() == "DONE"
    query = result.metrics().query(MetricsFilter().with_namespace("engines_many"))
    (seen,) = query["counters"]
    assert seen.committed == len(numbers)
    (sizes,) = query["distributions"]
    assert (sizes.committed.count, sizes.committed.sum) == (len(numbers), sum(numbers))
    assert (sizes.committed.min, sizes.committed.max) == (0, len(numbers) - 1)


def test_dask_readers_outrank_what_they_read_and_side_inputs_outrank_all():
    # Dask ran the image step over every partition before the steps that read its output, so
    # every record was held at once. A step's tasks now outrank those of the steps it reads,
    # and steps that only make side inputs outrank everything (what waits for a side input
    # cannot start before it).
    from beam_pipelines.engines import dask_runner

    pipeline = beam.Pipeline()
    numbers = pipeline | beam.Create(list(range(48))) | "Spread" >> beam.Reshuffle()
    names = numbers | "Names" >> beam.combiners.Count.Globally()
    plan = numbers | "Plan" >> beam.combiners.Count.Globally()
    made = numbers | "Make" >> beam.Map(lambda x, _: x, AsSingleton(names))
    read = made | "Read" >> beam.Map(lambda x, _: x, AsSingleton(plan))
    grouped = (
        read
        | "Key" >> beam.Map(lambda x: (x % 3, x))
        | "Group" >> beam.GroupByKey()
        | "Sizes" >> beam.MapTuple(lambda key, values: (key, len(list(values))))
    )
    total = made | "Count" >> beam.combiners.Count.Globally()
    pipeline.replace_all(
        [dask_runner._LiftCombinePerKey(), *dask_runner.primitives.primitive_overrides()]
    )
    counter = dask_runner._ConsumerCounter()
    pipeline.visit(counter)
    side_only = counter.side_only()
    assert names in side_only and plan in side_only
    assert not {made, read, grouped, total} & side_only
    translator = dask_runner._BagTranslator(
        {}, 4, "topic", consumers=counter.consumers, side_only=side_only
    )
    pipeline.visit(translator)

    def priority(pcoll):
        bag = translator._bags[pcoll]
        return bag.dask.layers[bag.name].annotations["priority"]

    assert priority(made) < priority(read) < priority(grouped)
    assert priority(made) < priority(total)
    assert min(priority(names), priority(plan)) > max(priority(grouped), priority(total))


# ---------------------------------------------------------------------------------------------
# The real pipeline on every engine


def _dataset_files(output: Path) -> dict[str, bytes]:
    # Hidden names are temporaries and staging files; none may be left behind either.
    files = {p.name: p.read_bytes() for p in output.iterdir() if p.is_file()}
    assert not [n for n in files if n.startswith(".")], sorted(files)
    return files


@pytest.fixture(scope="module")
def engine_input(tmp_path_factory) -> Path:
    """21 inputs: 17 JPEGs in 3 classes, a PNG named .JPEG, a duplicate, 2 bad files."""
    root = tmp_path_factory.mktemp("engines") / "images"
    paths = make_image_tree(root, {"cat": 6, "dög": 6, "red fox": 5})
    bad = make_bad_files()
    (root / "cat" / "empty.jpg").write_bytes(bad["empty_file"])
    (root / "dög" / "error page.jpg").write_bytes(bad["not_an_image"])
    (root / "red fox" / "copy.jpg").write_bytes(paths["cat"][0].read_bytes())
    (root / "red fox" / "disguised.JPEG").write_bytes(png_bytes(seed=7))
    return root


@pytest.fixture(scope="module")
def in_process_reference(engine_input, tmp_path_factory):
    output = tmp_path_factory.mktemp("engines") / "in-process"
    summary = run(["--input", str(engine_input), "--output", str(output), *_PIPELINE_FLAGS])
    assert summary.published
    counts = summary.manifest.counts
    assert (counts.input, counts.written, counts.rejected, counts.duplicates) == (21, 18, 2, 1)
    return summary, _dataset_files(output)


def _engine_args(engine: str, request) -> list[str]:
    if engine == "dask":
        return request.getfixturevalue("dask_cluster").runner_args()
    if engine == "beams_direct_runner":
        # Beam's own DirectRunner (tries Prism, falls back to the FnApiRunner when offline).
        return ["--runner", "apache_beam.runners.direct.direct_runner.SwitchingDirectRunner"]
    if engine == "portable_loopback":
        return ["--runner", "PortableRunner", "--job_endpoint", "embed"] + [
            "--environment_type",
            "LOOPBACK",
        ]
    raise AssertionError(engine)


@pytest.mark.slow
# The multi-process DirectRunner is held to the same standard by
# tests/test_pipeline.py::test_multi_process_runner_is_byte_identical.
@pytest.mark.parametrize("engine", ["dask", "portable_loopback", "beams_direct_runner"])
def test_engine_writes_byte_identical_dataset(
    engine, engine_input, in_process_reference, tmp_path, request
):
    reference, reference_files = in_process_reference
    output = tmp_path / engine
    summary = run(
        [
            "--input",
            str(engine_input),
            "--output",
            str(output),
            *_PIPELINE_FLAGS,
            *_engine_args(engine, request),
        ]
    )
    assert summary.published
    files = _dataset_files(output)
    assert sorted(files) == sorted(reference_files)
    for name, data in reference_files.items():
        assert files[name] == data, f"{engine}: {name} differs from the in-process run"
    manifest = decode_manifest(files[MANIFEST_NAME], files.__getitem__)
    assert manifest == reference.manifest
    assert len(manifest.all_shards()) == 6  # 4 train, ceil(4 * 0.25 / 0.75) = 2 validation
    # Beam counters come back from every engine, the Dask workers included.
    assert summary.metrics == reference.metrics
    assert summary.metrics["images_written"] == 18


@pytest.mark.slow
def test_unreachable_dask_scheduler_fails_naming_it_and_publishes_nothing(engine_input, tmp_path):
    address = f"tcp://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    output = tmp_path / "never"
    with pytest.raises(JobFailedError, match=address):  # a job failure: exit 3
        run(
            ["--input", str(engine_input), "--output", str(output), *_PIPELINE_FLAGS]
            + ["--runner", "DaskRunner", "--dask_client_address", address]
            + ["--dask_connection_timeout", "1"]
        )
    assert not (output / MANIFEST_NAME).exists()
    assert not list(output.glob("*.tfrecord")) if output.exists() else True

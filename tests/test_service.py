"""tf.data service: argument checks, and real dispatcher/worker processes on loopback.

The process tests share one module-scoped cluster (a fault-tolerant dispatcher and 2 workers)
because each process start costs seconds of TensorFlow import. They run in file order: the
later tests break the cluster on purpose (kill a worker, crash the dispatcher, SIGTERM all) and
each one first checks the cluster is whole again. Ctrl-C and SIGTERM under a pseudo-terminal
run a dispatcher of their own.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.data_service import DataServiceCluster, ServiceProcess
from tests.fixtures.processes import free_ports, process_env, run_in_terminal
from tests.fixtures.shards import WrittenDataset, write_dataset
from tfrecord_io.service import server as service_cli
from tfrecord_io.service.client import (
    DistributeOptions,
    ServiceAddress,
    ServiceConfig,
    distribute_dataset,
    training_job_name,
)

BATCH = 4
IMAGE_SIZE = 32
TRAIN_EXAMPLES = 48
EVAL_EXAMPLES = 22


# --- argument checks (no processes) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("grpc://localhost:5050", "localhost", 5050),
        ("localhost:5050", "localhost", 5050),
        ("grpc://10.0.0.7:1", "10.0.0.7", 1),
        ("grpc://[::1]:65535", "[::1]", 65535),
        ("grpc://data-svc.example.com:5050", "data-svc.example.com", 5050),
    ],
)
def test_service_address_parses(text: str, host: str, port: int) -> None:
    address = ServiceAddress.parse(text)
    assert (address.host, address.port) == (host, port)
    assert address.target == f"grpc://{host}:{port}"
    assert address.host_port == f"{host}:{port}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http://localhost:5050", "protocol 'http'"),
        ("grpc://localhost", "not of the form"),
        ("grpc://:5050", "not of the form"),
        ("grpc://localhost:0", "1..65535"),
        ("grpc://localhost:70000", "1..65535"),
        ("grpc://local host:5050", "host name"),
        ("grpc://localhost:50x", "not of the form"),
        (5050, "must be a str"),
    ],
)
def test_service_address_rejects(text: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        ServiceAddress.parse(text)  # type: ignore[arg-type]
    assert repr(text) in str(info.value)


def test_distribute_options_normalise() -> None:
    options = DistributeOptions(service="localhost:5050", training=True, compression="snappy")
    assert options.service == "grpc://localhost:5050"
    assert options.compression == "SNAPPY"
    assert (
        DistributeOptions(service="localhost:1", training=False, compression=None).compression
        == "NONE"
    )
    assert DistributeOptions(service="localhost:1", training=False).compression == "AUTO"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"training": 1}, "training must be a bool, got 1"),
        ({"job_name": ""}, "job_name must be None or .*got ''"),
        ({"job_name": "has space"}, "got 'has space'"),
        ({"job_name": 7}, "got 7"),
        (
            {"compression": "gzip"},
            r"compression must be one of \('AUTO', 'SNAPPY', 'NONE'\), got 'gzip'",
        ),
        ({"max_outstanding_requests": 0}, "max_outstanding_requests .* got 0"),
        ({"service": "ftp://x:1"}, "protocol 'ftp'"),
    ],
)
def test_distribute_options_reject(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"service": "grpc://localhost:5050", "training": True, **kwargs}
    with pytest.raises(ValueError, match=message):
        DistributeOptions(**arguments)  # type: ignore[arg-type]


def test_distribute_dataset_rejects_non_dataset() -> None:
    with pytest.raises(TypeError, match="must be a tf.data.Dataset, got list"):
        distribute_dataset([1, 2], service="grpc://localhost:5050", training=True)


def test_training_job_name_follows_the_pipeline() -> None:
    import tensorflow as tf

    def pipeline(files: list[str], batch: int, seed: int = 1) -> tf.data.Dataset:
        return (
            tf.data.Dataset.from_tensor_slices(files)
            .shuffle(2, seed=seed)
            .interleave(tf.data.TFRecordDataset, num_parallel_calls=2)
            .map(lambda record: tf.strings.length(record))
            .batch(batch)
        )

    first = training_job_name(pipeline(["/d/a", "/d/b"], 4))
    # Tracing other functions first moves the process-wide name counters: no effect.
    for i in range(3):
        tf.data.Dataset.range(3).map(lambda x, i=i: x + i)
    assert first == training_job_name(pipeline(["/d/a", "/d/b"], 4))
    assert first.startswith("train-")
    assert first != training_job_name(pipeline(["/d/a", "/d/c"], 4))
    assert first != training_job_name(pipeline(["/d/a", "/d/b"], 8))
    assert first != training_job_name(pipeline(["/d/a", "/d/b"], 4, seed=2))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["dispatcher", "--port", "-1"], "port must be an int in 0..65535"),
        (["dispatcher", "--port", "1", "--job_gc_timeout_ms", "0"], "job_gc_timeout_ms must be"),
        (["worker", "--dispatcher", "http://h:1"], "protocol 'http'"),
        (["worker", "--dispatcher", "h:1", "--worker_address", "nohost"], "worker_address must"),
        (["worker", "--dispatcher", "h:1", "--port", "99999"], "port must be an int"),
    ],
)
def test_cli_rejects_bad_flags(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        service_cli.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("role", "settings"),
    [("dispatcher", service_cli.DispatcherSettings), ("worker", service_cli.WorkerSettings)],
)
def test_cli_flags_are_the_settings_fields(role: str, settings: type) -> None:
    import dataclasses

    parser = service_cli.command_line_parser()
    roles = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = roles.choices[role]
    flags = {a.dest: a for a in sub._actions if a.dest != "help"}
    assert set(flags) == {f.name for f in dataclasses.fields(settings)}
    for field in dataclasses.fields(settings):
        assert flags[field.name].help, field.name
        required = field.default is dataclasses.MISSING
        assert flags[field.name].required == required, field.name
        if not required:
            assert flags[field.name].default == field.default, field.name


# --- real processes ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> WrittenDataset:
    return write_dataset(
        tmp_path_factory.mktemp("service_data") / "ds",
        encoding="jpeg",
        examples={"train": TRAIN_EXAMPLES, "validation": EVAL_EXAMPLES},
        num_shards={"train": 6, "validation": 4},
        image_size=IMAGE_SIZE + 8,
    )


@pytest.fixture(scope="module")
def cluster(data_service_module: DataServiceCluster) -> DataServiceCluster:
    return data_service_module


def _make(
    dataset: WrittenDataset,
    split: str,
    *,
    training: bool,
    service: str | ServiceConfig | None,
    num_epochs: int | None = None,
):
    import tfrecord_io

    return tfrecord_io.make_dataset(
        str(dataset.root),
        split,
        global_batch_size=BATCH,
        training=training,
        image_size=IMAGE_SIZE,
        read_config=tfrecord_io.ReadConfig(with_keys=True, num_epochs=num_epochs),
        service=service,
    )


def _eval_pass(dataset: WrittenDataset, service: str | None) -> dict[str, tuple[int, np.ndarray]]:
    """key -> (label, image) over one eval pass; fails on a repeated key."""
    seen: dict[str, tuple[int, np.ndarray]] = {}
    for images, labels, keys in _make(
        dataset, "validation", training=False, service=service
    ).as_numpy_iterator():
        for image, label, key in zip(images, labels, keys, strict=True):
            assert key.decode() not in seen, f"example {key.decode()} read twice"
            seen[key.decode()] = (int(label), image)
    return seen


def _assert_whole(cluster: DataServiceCluster) -> None:
    assert cluster.dispatcher is not None and cluster.dispatcher.alive
    live = [w for w in cluster.workers if w.alive]
    assert len(live) == 2, "an earlier test left the cluster broken"


def _read_with_deadline(iterator, count: int, seconds: float) -> list:
    """Reads ``count`` elements, failing (not hanging) if they do not come in ``seconds``."""
    got: list = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(count):
                got.append(next(iterator))
        except BaseException as e:  # reported to the test thread below
            failure.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if failure:
        raise failure[0]
    assert len(got) == count, f"only {len(got)} of {count} batches arrived in {seconds:.0f} s"
    return got


def _batches_until_all_seen(iterator, keys: set[str], max_batches: int, seconds: float) -> int:
    """Reads until every key in ``keys`` has come by; returns the batches it took.

    Fails (not hangs) if that takes more than ``max_batches`` or ``seconds``.
    """
    missing = set(keys)
    deadline = time.monotonic() + seconds
    for count in range(1, max_batches + 1):
        (batch,) = _read_with_deadline(iterator, 1, max(1.0, deadline - time.monotonic()))
        missing -= {k.decode() for k in batch[2].numpy()}
        if not missing:
            return count
    raise AssertionError(f"{len(missing)} example(s) never came in {max_batches} batches")


def _process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_eval_epoch_through_two_workers_yields_every_example_once(
    cluster: DataServiceCluster, dataset: WrittenDataset
) -> None:
    idle_start = sum(_process_cpu_seconds(w.popen.pid) for w in cluster.workers)
    local = _eval_pass(dataset, service=None)
    cpu_before = sum(_process_cpu_seconds(w.popen.pid) for w in cluster.workers)
    idle_cpu = cpu_before - idle_start  # what the workers burn while another pass reads locally
    first = _eval_pass(dataset, service=cluster.address)
    # A second pass is a new anonymous job: again every example exactly once.
    second = _eval_pass(dataset, service=cluster.address)
    expected = set(dataset.keys("validation"))
    assert set(first) == expected and set(second) == expected
    labels = dataset.labels("validation")
    for key, (label, image) in first.items():
        assert label == labels[key]
        # The workers run the very same pipeline: eval decoding is deterministic.
        np.testing.assert_array_equal(image, local[key][1])
    # The decoding ran in the worker processes: their CPU time grew. (Which worker gets the
    # tasks of a short job depends on heartbeat timing, so this is summed over both.)
    cpu_after = sum(_process_cpu_seconds(w.popen.pid) for w in cluster.workers)
    assert cpu_after - cpu_before > idle_cpu + 0.05, (
        f"the service workers did no work: {cpu_after - cpu_before:.3f} CPU-s over a service "
        f"pass against {idle_cpu:.3f} CPU-s over a local one"
    )


SHARED_EPOCHS = 3


@pytest.mark.slow
def test_training_consumers_share_one_job(
    cluster: DataServiceCluster, dataset: WrittenDataset
) -> None:
    """Two trainers that build the same pipeline (each deriving the job name on its own) split
    one job between them instead of each reading everything: over the job's epochs, no example
    reaches them more often than there are epochs. (That the name agrees across real trainer
    processes is checked by the trainer test below.)"""
    # Two batches per message (the default, 128 examples, is most of this tiny job): the
    # trainers split messages apart, and the job is split between them by message.
    service = ServiceConfig(cluster.address, examples_per_message=2 * BATCH)
    consumers = [
        _make(dataset, "train", training=True, service=service, num_epochs=SHARED_EPOCHS)
        for _ in range(2)
    ]
    iterators = [iter(consumer) for consumer in consumers]
    received: list[list[str]] = [[], []]
    live = [0, 1]
    while live:
        for i in list(live):
            try:
                images, labels, keys = next(iterators[i])
            except StopIteration:
                live.remove(i)
                continue
            assert images.shape == (BATCH, IMAGE_SIZE, IMAGE_SIZE, 3) and images.dtype == np.uint8
            assert set(labels.numpy()) <= {0, 1, 2}
            received[i].extend(k.decode() for k in keys.numpy())
    assert received[0] and received[1], [len(r) for r in received]
    counts = collections.Counter(received[0] + received[1])
    assert set(counts) == set(dataset.keys("train"))
    assert max(counts.values()) <= SHARED_EPOCHS, "both trainers read the same epoch"
    # Each worker batches its own shards and drops its last partial batch of every epoch.
    lost = SHARED_EPOCHS * len(cluster.workers) * (BATCH - 1)
    assert sum(counts.values()) >= SHARED_EPOCHS * TRAIN_EXAMPLES - lost


@pytest.mark.slow
def test_two_trainer_workers_train_through_one_service_job(
    cluster: DataServiceCluster, dataset: WrittenDataset, tmp_path: Path
) -> None:
    """``python -m trainer.train --data_service``: two MultiWorkerMirroredStrategy workers on
    loopback, both fed by the service, share one job."""
    steps, global_batch = 6, 8
    trainers = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    command = [
        sys.executable,
        "-m",
        "trainer.train",
        f"--data={dataset.root}",
        f"--data_service={cluster.address}",
        f"--model_dir={tmp_path / 'run'}",
        f"--audit_keys={tmp_path / 'keys'}",
        f"--steps={steps}",
        f"--global_batch_size={global_batch}",
        f"--image_size={IMAGE_SIZE}",
        "--log_every=2",
        "--eval_every=1000",
        "--checkpoint_every=1000",
        "--warmup_steps=2",
    ]
    procs = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={
                **env,
                "TF_CPP_MIN_LOG_LEVEL": "2",
                "TF_CONFIG": json.dumps(
                    {"cluster": trainers, "task": {"type": "worker", "index": i}}
                ),
            },
        )
        for i in range(2)
    ]
    try:
        logs = [proc.communicate(timeout=240)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    jobs = set()
    for i, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        assert proc.returncode == 0, log
        assert f"done at step {steps}" in log, log
        # Received batches reuse freed memory: on by default with --data_service.
        assert "malloc keeps freed memory for reuse" in log, log
        assert "gRPC reads large messages in bulk" in log, log
        match = re.search(r"reading training input through tf.data service \S+: job (\S+),", log)
        assert match, log
        jobs.add(match.group(1))
        trained = (tmp_path / f"keys.worker-{i:05d}").read_text().split()
        assert len(trained) == steps * global_batch // 2
        assert set(trained) <= set(dataset.keys("train"))
    assert len(jobs) == 1, f"the trainers read different jobs: {jobs}"


@pytest.mark.slow
def test_killing_a_worker_does_not_stop_training(
    cluster: DataServiceCluster, dataset: WrittenDataset
) -> None:
    _assert_whole(cluster)
    iterator = iter(
        _make(dataset, "train", training=True, service=ServiceConfig(cluster.address, "kill"))
    )
    _read_with_deadline(iterator, 4, 60)
    victim = cluster.workers[1]
    port = victim.port
    victim.kill()
    # Past what any buffer holds, every example still comes: the surviving worker reads every
    # shard, including those the dead one would have taken.
    _read_with_deadline(iterator, 2 * TRAIN_EXAMPLES // BATCH, 60)
    _batches_until_all_seen(iterator, set(dataset.keys("train")), 8 * TRAIN_EXAMPLES // BATCH, 60)

    # tf.data 2.21 keeps a lost worker's tasks: a new finite job waits for it. A replacement
    # on the same address takes them over, and the eval pass completes, exactly once.
    replacement = ServiceProcess(
        "worker",
        [*victim.args, "--port", str(port)],
        victim.log_path,
    )
    cluster.workers[1] = replacement
    assert replacement.wait_until_serving() == port
    passes = []
    thread = threading.Thread(
        target=lambda: passes.append(_eval_pass(dataset, cluster.address)), daemon=True
    )
    thread.start()
    thread.join(90)
    assert passes, "the eval pass did not finish after the worker was replaced"
    assert set(passes[0]) == set(dataset.keys("validation"))


@pytest.mark.slow
def test_dispatcher_restarted_with_work_dir_keeps_serving(
    cluster: DataServiceCluster, dataset: WrittenDataset
) -> None:
    _assert_whole(cluster)
    iterator = iter(
        _make(dataset, "train", training=True, service=ServiceConfig(cluster.address, "crash"))
    )
    _read_with_deadline(iterator, 4, 60)
    old = cluster.dispatcher
    assert old is not None
    old.kill()  # a crash: no chance to write anything more to the work_dir
    restarted = cluster.start_dispatcher()
    assert restarted.port == old.port
    # The journal brings back the workers and the job: the in-flight training iterator goes
    # on, past what any buffer holds, and every example still comes.
    _read_with_deadline(iterator, 2 * TRAIN_EXAMPLES // BATCH, 90)
    _batches_until_all_seen(iterator, set(dataset.keys("train")), 8 * TRAIN_EXAMPLES // BATCH, 60)
    # New jobs work too.
    assert set(_eval_pass(dataset, cluster.address)) == set(dataset.keys("validation"))
    del iterator  # lets go of the job now, for the next test's wait for abandoned jobs
    gc.collect()


@pytest.mark.slow
def test_sigterm_stops_dispatcher_and_workers_cleanly(cluster: DataServiceCluster) -> None:
    _assert_whole(cluster)
    # First, the earlier tests' endless training jobs, now without consumers, are collected
    # (tf.data alone would keep dynamic-sharding jobs running forever).
    gc.collect()  # an iterator an earlier test left in a reference cycle still holds its job
    dispatcher = cluster.dispatcher
    assert dispatcher is not None
    deadline = time.monotonic() + 60
    for worker in cluster.workers:
        while re.findall(r"(\d+) task\(s\) running", worker.log_since_start())[-1] != "0":
            assert time.monotonic() < deadline, (
                f"abandoned jobs still run:\n{worker.log_tail()}\n"
                f"dispatcher:\n{dispatcher.log_tail()}"
            )
            time.sleep(0.2)
    statuses = cluster.stop()
    # 128 + SIGTERM, as a shell reports a process SIGTERM ended; the stop was still clean.
    assert statuses == {"worker0": 143, "worker1": 143, "dispatcher": 143}
    for process in [*cluster.workers, cluster.dispatcher]:
        assert process is not None
        log = process.log_since_start()
        # One line after the signal: stopped cleanly, what was kept and how to continue (on the
        # port it had, which a rerun of --port 0 would not get back).
        asked = process.args[process.args.index("--port") + 1] if "--port" in process.args else "0"
        rerun = "rerun the same command" if asked != "0" else f"rerun it with --port {process.port}"
        kept = (
            f"nothing was kept (a worker holds no state): {rerun} to serve its dispatcher again "
            "at the same address"
            if process.role == "worker"
            else f"its journal in {cluster.work_dir} is kept: {rerun} to recover its datasets, "
            "jobs and workers"
        )
        assert re.search(
            rf"tf\.data service {process.role} stopped cleanly after SIGTERM, with "
            rf"\d+ (worker\(s\) registered|task\(s\) running); {re.escape(kept)}\n$",
            log,
        ), log
    dispatcher_log = cluster.dispatcher.log_since_start()
    assert "mode fault-tolerant" in dispatcher_log and str(cluster.work_dir) in dispatcher_log


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "status", "work_dir"),
    [("ctrl-c", 130, True), ("sigterm", 143, False)],
    ids=["ctrl-c-fault-tolerant", "sigterm-in-memory"],
)
def test_a_signal_stops_the_dispatcher_with_one_line_saying_what_was_kept(
    tmp_path: Path, how: str, status: int, work_dir: bool
) -> None:
    port = free_ports(1)[0]
    journal = tmp_path / "work_dir"
    argv = ["-m", "tfrecord_io.service", "dispatcher", "--port", str(port)]
    env = process_env()
    del env["TF_CPP_MIN_LOG_LEVEL"]  # a user's shell: TensorFlow's start-up lines would show
    code, text, elapsed = run_in_terminal(
        [*argv, *(["--work_dir", str(journal)] if work_dir else [])],
        wait_for=lambda pid: _listening(port),
        how=how,
        env=env,
        deadline_s=120.0,
    )
    assert code == status, text
    assert elapsed < 15.0, text  # a few seconds, on a shared, loaded machine
    # Its start-up lines, then the one line the signal gives: no traceback, nothing else.
    lines = [line for line in text.replace("^C", "").splitlines() if line.strip()]
    assert len(lines) == 3, text
    assert "tf.data service dispatcher serving at" in lines[0], text
    assert lines[1].endswith("tf.data service dispatcher: 0 worker(s) registered"), text
    name = "Ctrl-C (SIGINT)" if how == "ctrl-c" else "SIGTERM"
    kept = (
        f"its journal in {journal} is kept: rerun the same command to recover its datasets, "
        "jobs and workers"
        if work_dir
        else "nothing was kept (without --work_dir its datasets and jobs were in memory): "
        "rerun the same command to serve again"
    )
    assert lines[2].endswith(
        f"tf.data service dispatcher stopped cleanly after {name}, with 0 worker(s) "
        f"registered; {kept}"
    ), text
    assert (journal / "tf_data_dispatcher_journal").is_dir() == work_dir


def test_examples_per_message_groups_whole_training_batches() -> None:
    config = ServiceConfig("localhost:5050")
    assert config.examples_per_message == 128
    assert config.batches_per_message(32, training=True) == 4
    assert config.batches_per_message(48, training=True) == 3
    assert config.batches_per_message(128, training=True) == 1
    assert config.batches_per_message(32, training=False) == 1
    assert ServiceConfig("localhost:1", examples_per_message=1).batches_per_message(4, True) == 1
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match=f"examples_per_message .*got {bad!r}"):
            ServiceConfig("localhost:1", examples_per_message=bad)  # type: ignore[arg-type]


def test_split_message_gives_the_batches_of_the_stream_without_copies() -> None:
    """Messages of 4 batches split into the very batches batching the stream by 3 gives; a
    short last message keeps its whole batches only."""
    import tensorflow as tf

    from tfrecord_io.service.client import split_message

    n, batch = 3 * 4 * 2 + 7, 3  # two whole messages and a short one of 2 batches + 1 example
    images = np.arange(n * 2 * 2 * 3, dtype=np.uint8).reshape(n, 2, 2, 3)
    labels = np.arange(n, dtype=np.int32)
    stream = tf.data.Dataset.from_tensor_slices((images, labels))
    split = stream.batch(batch * 4).flat_map(lambda *parts: split_message(parts, batch))
    assert split.element_spec[0].shape.as_list() == [batch, 2, 2, 3]
    got = list(split.as_numpy_iterator())
    expected = list(stream.batch(batch, drop_remainder=True).as_numpy_iterator())
    assert len(got) == len(expected) == n // batch
    for (gi, gl), (ei, el) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(gi, ei)
        np.testing.assert_array_equal(gl, el)

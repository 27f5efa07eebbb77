"""The pipeline on real Flink and Spark clusters started here, against the in-process runner.

The clusters come from ``tests/fixtures/{flink,spark}_cluster.py`` (one of each per session) and
the job servers from ``scripts/engines/install.sh``. To keep CI short, one test per engine, of
two engine jobs, covers the rest: a build with ``--validation_fraction``,
``--stratify_validation`` and ``--base`` is interrupted under a terminal (Flink by Ctrl-C, Spark
by SIGTERM: one line, the engine's job ended), then resumed on the engine with its TaskManager
(Flink) or worker (Spark) killed half-way; every file must still be byte-identical to the
in-process runner's. The option checks at the top need no cluster and no Java.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.portable_runner import JobServiceHandle

from beam_pipelines.command_line import parse_command_line
from beam_pipelines.engines import flink, portable, spark
from beam_pipelines.engines.local_clusters import (
    LOCAL_JVM_OPTIONS,
    SPARK_HEARTBEAT_WHOLE,
    SPARK_KRYO,
    SPARK_MEMORY_FRACTION,
    FlinkCluster,
    SparkCluster,
    free_port,
    is_running,
    read_cluster,
    start_flink_taskmanager,
    start_spark_worker,
)
from beam_pipelines.engines.runners import FLINK_RUNNER, SPARK_RUNNER, resolve_runner_aliases
from beam_pipelines.images_to_tfrecord import JobFailedError, run
from benchmarks.profile_jvm_engines import stack_categories, task_thread_states
from tests.fixtures.images import make_image_tree
from tests.fixtures.processes import run_in_terminal
from tests.test_engine_sizing import _properties
from tests.test_engines import _PIPELINE_FLAGS, _dataset_files, engine_input  # noqa: F401
from tests.test_interrupts import FEW_SECONDS, _snapshot

_FLAGS = [*_PIPELINE_FLAGS, "--stratify_validation"]


# ---------------------------------------------------------------------------------------------
# Runner names and option checks (no cluster, no Java)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("FlinkRunner", FLINK_RUNNER),
        ("apache_beam.runners.portability.flink_runner.FlinkRunner", FLINK_RUNNER),
        ("SparkRunner", SPARK_RUNNER),
        ("apache_beam.runners.portability.spark_runner.SparkRunner", SPARK_RUNNER),
    ],
)
def test_flink_and_spark_names_select_the_project_runners(name, expected):
    assert resolve_runner_aliases(["--runner", name]) == ["--runner", expected]


def test_a_missing_job_server_names_the_install_command_and_the_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("TFRECORD_ENGINES_HOME", str(tmp_path))
    with pytest.raises(ValueError, match=r"scripts/engines/install.sh.*--flink_job_server_jar"):
        flink.prepare_flink_options(PipelineOptions(["--flink_master", "[local]"]))
    with pytest.raises(ValueError, match=r"scripts/engines/install.sh.*--spark_job_server_jar"):
        spark.prepare_spark_options(PipelineOptions(["--spark_master_url", "local[2]"]))
    missing = str(tmp_path / "nope.jar")
    with pytest.raises(ValueError, match=f"--flink_job_server_jar '{missing}' does not exist"):
        flink.prepare_flink_options(PipelineOptions(["--flink_job_server_jar", missing]))


def _fake_jar(tmp_path: Path) -> str:
    jar = tmp_path / "job-server.jar"
    jar.write_bytes(b"")
    return str(jar)


def test_an_unreachable_cluster_is_named_with_the_command_that_starts_one(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    jar = _fake_jar(tmp_path)
    options = PipelineOptions(["--flink_master", address, "--flink_job_server_jar", jar])
    with pytest.raises(ValueError, match=f"--flink_master {address} is not reachable.*cluster.py"):
        flink.prepare_flink_options(options)
    options = PipelineOptions(
        ["--spark_master_url", f"spark://{address}", "--spark_job_server_jar", jar]
    )
    with pytest.raises(ValueError, match=f"spark://{address} is not reachable.*cluster.py"):
        spark.prepare_spark_options(options)
    options = PipelineOptions(["--spark_master_url", "yarn", "--spark_job_server_jar", jar])
    with pytest.raises(ValueError, match="'yarn' is not a Spark master"):
        spark.prepare_spark_options(options)


def test_spark_caches_spill_to_disk_unless_a_storage_level_is_given(tmp_path, capsys):
    # Beam's Spark runner caches what two steps read at MEMORY_ONLY unless told: at 1 M images
    # what did not fit was computed again (1.6x the CPU per image). The level travels to the
    # job server among the pipeline options, as Beam's portable runner encodes them.
    jar = _fake_jar(tmp_path)
    options = PipelineOptions(["--spark_master_url", "local[2]", "--spark_job_server_jar", jar])
    spark.prepare_spark_options(options)
    sent = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    assert sent["beam:option:storage_level:v1"] == "MEMORY_AND_DISK"
    # Spilling needs Kryo in the driver: Java serialization refuses Beam's RawUnionValue.
    assert SPARK_KRYO in _properties(options)
    # Spark's caches leave the executors' heap to Beam's queues sooner (GC at 10 M images).
    assert SPARK_MEMORY_FRACTION in _properties(options)
    # Executors' heartbeats send Beam's accumulators whole (isZero throws mid-deserialization).
    assert SPARK_HEARTBEAT_WHOLE in _properties(options)
    own = ["--job_server_jvm_properties=-Dspark.memory.fraction=0.5"]
    chosen = PipelineOptions(
        ["--spark_master_url", "local[2]", "--spark_job_server_jar", jar, *own]
    )
    spark.prepare_spark_options(chosen)
    assert [p for p in _properties(chosen) if "memory.fraction" in p] == [own[0].split("=", 1)[1]]
    # A running job server's driver is set already: Beam's default stays unless given, and
    # the local cluster, whose driver runs Kryo, gives it.
    running = PipelineOptions(
        ["--spark_master_url", "local[2]", "--spark_job_server_jar", jar, "--job_endpoint",
         "127.0.0.1:7"]
    )  # fmt: skip
    spark.prepare_spark_options(running)
    assert running.view_as(spark.SparkStorageOptions).storage_level is None
    assert SPARK_KRYO not in _properties(running)
    assert SPARK_MEMORY_FRACTION not in _properties(running)
    assert SPARK_HEARTBEAT_WHOLE not in _properties(running)
    kept = SparkCluster(1, 2, tmp_path, os.getpid(), (os.getpid(),), 2, job_server_port=7,
                        job_server_pid=os.getpid(), job_server_ui_port=9)  # fmt: skip
    assert "--storage_level=MEMORY_AND_DISK" in kept.runner_args()
    given = PipelineOptions(
        ["--spark_master_url", "local[2]", "--spark_job_server_jar", jar, "--storage_level",
         "MEMORY_ONLY"]
    )  # fmt: skip
    spark.prepare_spark_options(given)
    assert given.view_as(spark.SparkStorageOptions).storage_level == "MEMORY_ONLY"
    # The command line knows the flag, and still refuses a misspelling of it.
    _, beam_argv = parse_command_line(
        ["--input", "in", "--output", "out", "--storage_level=DISK_ONLY"]
    )
    assert "--storage_level=DISK_ONLY" in beam_argv
    with pytest.raises(SystemExit):
        parse_command_line(["--input", "in", "--output", "out", "--storage_levl=DISK_ONLY"])
    assert "--storage_level" in capsys.readouterr().err  # the closest known flag, suggested


def test_a_cluster_asks_for_the_slots_of_its_running_taskmanagers_only(tmp_path):
    # After a TaskManager is killed and replaced, cluster.json lists both: a job that asked
    # for four slots on the two that are left waited for slots that never came.
    stopped = subprocess.Popen(["true"])
    stopped.wait()
    cluster = FlinkCluster(1, tmp_path, os.getpid(), (stopped.pid, os.getpid()), slots=2)
    assert cluster.runner_args()[-2:] == ["--parallelism", "2"]
    assert cluster.runner_args(parallelism=3)[-1] == "3"


def test_a_cluster_sends_jobs_to_the_job_server_it_keeps_while_it_runs(tmp_path):
    stopped = subprocess.Popen(["true"])
    stopped.wait()
    kept = FlinkCluster(
        1, tmp_path, os.getpid(), (os.getpid(),), 2, job_server_port=7, job_server_pid=os.getpid()
    )
    assert kept.runner_args()[4:6] == ["--job_endpoint", "127.0.0.1:7"]
    assert "--job_endpoint" not in kept.runner_args(kept_job_server=False)
    gone = FlinkCluster(
        1, tmp_path, os.getpid(), (os.getpid(),), 2, job_server_port=7, job_server_pid=stopped.pid
    )
    assert "--job_endpoint" not in gone.runner_args()
    spark_kept = SparkCluster(1, 2, tmp_path, os.getpid(), (os.getpid(),), 2, job_server_port=7,
                              job_server_pid=os.getpid(), job_server_ui_port=9)  # fmt: skip
    args = spark_kept.runner_args()
    assert args[-4:-1] == [
        "--job_endpoint",
        "127.0.0.1:7",
        "--job_server_jvm_properties=-Dspark.ui.port=9",
    ]
    # The launcher then names the kept driver's web UI for the job link.
    options = PipelineOptions(
        ["--spark_master_url", "local[2]", "--spark_job_server_jar", _fake_jar(tmp_path), *args[4:]]
    )
    assert spark.prepare_spark_options(options) == "http://127.0.0.1:9"


class _SparkDriverUi(http.server.BaseHTTPRequestHandler):
    """A Spark driver's web UI as ``cancel_spark_jobs`` reads it: one application, its running
    jobs, and the kill link, which ends the job it names."""

    running = {3, 4}
    killed: list[int] = []

    def do_GET(self):
        if self.path == "/api/v1/applications":
            body = [{"id": "app-1"}]
        elif self.path == "/api/v1/applications/app-1/jobs?status=running":
            body = [{"jobId": j, "status": "RUNNING"} for j in sorted(self.running)]
        else:
            self.send_error(404)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        job = int(self.path.rsplit("=", 1)[1])
        type(self).killed.append(job)
        type(self).running.discard(job)
        self.send_response(302)
        self.send_header("Location", "/jobs/")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_cancelling_on_a_kept_spark_driver_kills_its_running_jobs():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SparkDriverUi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ui = f"http://127.0.0.1:{server.server_address[1]}"
        assert spark.cancel_spark_jobs(ui) == 2
        assert sorted(_SparkDriverUi.killed) == [3, 4]
        assert spark.cancel_spark_jobs(ui) == 0  # nothing left running
    finally:
        server.shutdown()
    # No driver answering: nothing to cancel, no error.
    assert spark.cancel_spark_jobs(f"http://127.0.0.1:{free_port()}", timeout_s=1) == 0


def test_sdk_workers_run_as_one_process_per_slot_kept_for_the_job(tmp_path, monkeypatch):
    # setenv first so that monkeypatch restores whatever was there, set or not.
    monkeypatch.setenv("MALLOC_ARENA_MAX", "unset")
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    options = PipelineOptions(
        ["--flink_master", "[local]", "--flink_job_server_jar", _fake_jar(tmp_path)]
    )
    flink.prepare_flink_options(options)
    everything = options.get_all_options()
    assert everything["parallelism"] == 2
    assert everything["environment_type"] == "LOOPBACK"
    assert "use_loopback_process_worker" in everything["experiments"]
    assert everything["sdk_worker_parallelism"] == 2
    assert everything["environment_cache_millis"] > 0
    assert "--add-opens=java.base/java.nio=ALL-UNNAMED" in everything["job_server_jvm_properties"]
    # The workers inherit it: their malloc arenas otherwise grew with the number of images.
    assert os.environ["MALLOC_ARENA_MAX"] == "2"


def test_the_engine_profile_sorts_python_stacks_and_jvm_task_threads():
    # py-spy --format raw: root-first frames, then the sample count; the innermost frame that
    # names a category decides.
    raw = "\n".join(
        [
            "run (apache_beam/runners/worker/sdk_worker.py:9);"
            "process (beam_pipelines/image/prepare.py:40);resize (PIL/Image.py:2200) 30",
            "run (apache_beam/runners/worker/sdk_worker.py:9);"
            "encode (apache_beam/coders/coder_impl.py:7) 5",
            "_read (apache_beam/runners/worker/data_plane.py:3);wait (threading.py:320) 4",
            "<module> (<string>:1) 1",
        ]
    )
    assert stack_categories(raw) == {
        "pipeline's own work": 30,
        "Beam coders": 5,
        "Fn API data plane, gRPC": 4,
        "other (interpreter, stdlib)": 1,
    }
    dump = (
        '"MapPartition (Prepare) (1/2)#0" #80 prio=5\n'
        "   java.lang.Thread.State: WAITING (parking)\n"
        "\tat jdk.internal.misc.Unsafe.park(Native Method)\n"
        "\tat org.apache.beam.sdk.fn.data.BeamFnDataInboundObserver.awaitCompletion(X.java:1)\n"
        "\n"
        '"flink-pekko.actor.default-dispatcher-5" #20\n'
        "   java.lang.Thread.State: RUNNABLE\n"
        "\tat org.apache.flink.Foo.bar(Foo.java:1)\n"
    )
    assert task_thread_states(dump) == {
        "WAITING at org.apache.beam.sdk.fn.data.BeamFnDataInboundObserver.awaitCompletion": 1
    }


# ---------------------------------------------------------------------------------------------
# The pipeline on the clusters


@pytest.fixture(scope="module")
def jvm_references(engine_input, tmp_path_factory):  # noqa: F811  (the imported fixture)
    """In-process builds: a published base, and a grown input built on that base."""
    root = tmp_path_factory.mktemp("jvm-engines")
    base = root / "base"
    assert run(["--input", str(engine_input), "--output", str(base), *_FLAGS]).published
    grown = root / "grown"
    shutil.copytree(engine_input, grown)
    # New images to prepare (a base's are not staged): the interrupt lands with most to go.
    make_image_tree(grown, {"cat": 12, "owl": 18}, seed=5, extension=".new.jpg")
    on_base = root / "on-base"
    summary = run(["--input", str(grown), "--output", str(on_base), "--base", str(base), *_FLAGS])
    assert summary.published and summary.metrics["images_reused"] >= 18  # the base's images
    return {
        "base_input": engine_input,
        "base": base,
        "grown": grown,
        "on_base": on_base,
        "summary": summary,
    }


def _assert_identical(
    output: Path, in_process: Path, engine: str, ignored: re.Pattern[bytes] | None = None
) -> None:
    """Every file of ``output`` is byte-identical to ``in_process``'s (but for ``ignored``)."""
    files, expected = _dataset_files(output), _dataset_files(in_process)
    assert sorted(files) == sorted(expected)
    for name, data in expected.items():
        if ignored is not None:
            data, files[name] = ignored.sub(b"", data), ignored.sub(b"", files[name])
        assert files[name] == data, f"{engine}: {name} differs from the in-process run"


@pytest.mark.slow
@pytest.mark.jvm
def test_the_flink_cluster_writes_its_own_log_files(flink_cluster):
    # Beam's jars in the cluster's lib/ once brought an SLF4J 2 API that ignored Flink's Log4j
    # binding: Flink logged nothing anywhere, and no log file was created.
    logs = flink_cluster.work_dir / "log"
    jobmanager = list(logs.glob("flink-*-standalonesession-*.log"))
    taskmanagers = list(logs.glob("flink-*-taskexecutor-*.log"))
    assert jobmanager and taskmanagers, sorted(p.name for p in logs.iterdir())
    assert "Starting StandaloneSessionClusterEntrypoint" in jobmanager[0].read_text()
    # Flink logs each JVM's options: a local cluster's compile with C1 only.
    assert LOCAL_JVM_OPTIONS in jobmanager[0].read_text()
    assert all(LOCAL_JVM_OPTIONS in p.read_text() for p in taskmanagers)
    assert any("Successful registration at resource manager" in p.read_text() for p in taskmanagers)
    consoles = [p.read_text(errors="replace") for p in logs.glob("*.log")]
    assert not any("SLF4J(W)" in text for text in consoles)


@pytest.mark.slow
@pytest.mark.jvm
def test_embedded_flink_writes_the_in_process_dataset(jvm_references, tmp_path):
    """``--flink_master [local]``: Flink's MiniCluster inside the job server, no cluster, two
    SDK worker processes; the dataset equals the in-process one."""
    output = tmp_path / "flink-local"
    argv = ["--input", str(jvm_references["base_input"]), "--output", str(output), *_FLAGS]
    argv += ["--runner", "FlinkRunner", "--flink_master", "[local]", "--parallelism", "2"]
    assert run(argv).published
    _assert_identical(output, jvm_references["base"], "flink [local]")


def _engine_jobs_left(cluster: FlinkCluster | SparkCluster) -> tuple[list[str], str]:
    """The engine's jobs still running, and the state of the newest one."""
    if isinstance(cluster, FlinkCluster):
        overview = portable.http_json(f"{cluster.web_ui}/jobs/overview")
        assert isinstance(overview, dict), overview
        jobs = sorted(overview["jobs"], key=lambda j: j["start-time"])
        return [j["jid"] for j in jobs if j["state"] not in ("CANCELED", "FAILED", "FINISHED")], (
            jobs[-1]["state"] if jobs else "none"
        )
    if cluster.job_server_ui_port:
        # The cluster's kept job server is the driver of one application for every job: the
        # application outlives the job, its Spark jobs may not.
        ui = f"http://127.0.0.1:{cluster.job_server_ui_port}"
        apps = portable.http_json(f"{ui}/api/v1/applications")
        assert isinstance(apps, list) and apps, apps
        jobs = portable.http_json(f"{ui}/api/v1/applications/{apps[0]['id']}/jobs")
        assert isinstance(jobs, list), jobs
        newest = max(jobs, key=lambda j: j["jobId"])["status"] if jobs else "none"
        return [j["jobId"] for j in jobs if j["status"] == "RUNNING"], newest
    master = portable.http_json(f"{cluster.web_ui}/json/")
    assert isinstance(master, dict), master
    done = sorted(master["completedapps"], key=lambda a: a["starttime"])
    return [a["id"] for a in master["activeapps"]], done[-1]["state"] if done else "none"


class _KillOnNewStaging:
    """Kills a cluster process once the build stages a record file not in ``staged_before``.

    The resumed build stages the images the interrupted one did not; its first new staged
    file shows the job running on the workers, well before any shard is written, so the kill
    lands half-way through it. A replacement process is started after it, as a supervisor
    would, so that the engine can run the job again.
    """

    def __init__(self, output: Path, staged_before: set[Path], victim: int, replace) -> None:
        self.killed_at: float | None = None
        self.replacement: int | None = None
        self._output, self._before = output, staged_before
        self._victim, self._replace = victim, replace
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> _KillOnNewStaging:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()  # a build that staged nothing new ends the watch (the test then fails)
        self._thread.join(timeout=120)

    def _watch(self) -> None:
        records = self._output / ".staging" / "records"
        while not self._stop.wait(0.05):
            if set(records.glob("*.tfrecord")) - self._before:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._victim, signal.SIGKILL)
                self.killed_at = time.monotonic()
                time.sleep(2)
                self.replacement = self._replace()
                return


def _victim_and_replacement(cluster: FlinkCluster | SparkCluster):
    if isinstance(cluster, FlinkCluster):
        return cluster.taskmanager_pids[-1], lambda: start_flink_taskmanager(cluster)
    return cluster.worker_pids[-1], lambda: start_spark_worker(cluster)


# Of tests/test_interrupts.py's FLAGS, the two that change no byte of the dataset: a staging
# file per example (the first is committed with most new images still to prepare, and the
# resume commits new ones the killer sees), and no progress bar on the terminal (one line).
_INTERRUPTIBLE = ["--staging_file_mb", "0.002", "--progress", "off"]
_LINEAGE_COUNTS = re.compile(rb'"(?:prepared|reused)": \d+')  # in "lineage" only


@pytest.mark.slow
@pytest.mark.jvm
@pytest.mark.parametrize(
    ("engine", "how", "status", "ended"),
    # Spark: the kept job server's application stays; its Spark job was cancelled (FAILED).
    [("flink", "ctrl-c", 130, "CANCELED"), ("spark", "sigterm", 143, "FAILED")],
)
def test_an_interrupted_engine_build_on_a_base_resumes_through_a_killed_worker_byte_identically(
    engine, how, status, ended, jvm_references, tmp_path, request, caplog
):
    # Two engine jobs per engine cover it all (CI time): --validation_fraction with
    # --stratify_validation and --base; interrupted under a terminal (issue 32); resumed on the
    # engine with a TaskManager / worker killed half-way through.
    caplog.set_level("INFO", logger="beam_pipelines.engines")
    # The cluster.json of the fixture lists replacements started by earlier tests too.
    cluster = read_cluster(request.getfixturevalue(f"{engine}_cluster").work_dir)
    output = tmp_path / engine
    argv = ["--input", str(jvm_references["grown"]), "--output", str(output)]
    argv += ["--base", str(jvm_references["base"]), *_FLAGS, *_INTERRUPTIBLE]
    on_engine = [*argv, *cluster.runner_args()]

    # Ctrl-C (the whole foreground group: launcher, job server, SDK workers) or SIGTERM (the
    # launcher alone) ends the launcher within seconds with one line, and the engine's job
    # with it, not left preparing images on its own.
    records = output / ".staging" / "records"
    code, text, elapsed = run_in_terminal(
        ["-m", "beam_pipelines.images_to_tfrecord", *on_engine],
        wait_for=str(records / "*.tfrecord"),
        how=how,
        deadline_s=240,
    )
    assert code == status, text
    assert elapsed < FEW_SECONDS, text
    assert "Traceback" not in text and "Exception" not in text, text
    assert not (output / "dataset.json").exists(), "the build ended before the signal"
    # Besides the engine's job link (logged when the job started), one line.
    lines = [
        line
        for line in text.replace("^C", "").splitlines()
        if line.strip()
        and not line.startswith(f"INFO beam_pipelines.engines.portable: {engine.title()} job")
    ]
    assert len(lines) == 1 and lines[0].startswith("interrupted by "), text
    assert lines[0].endswith(" --resume") and str(output / ".staging") in lines[0], text
    # The launcher cancelled the job on the engine before it exited.
    running, newest = _engine_jobs_left(cluster)
    assert not running and newest == ended, (running, newest)
    staged = _snapshot(output / ".staging")
    time.sleep(2)
    assert _snapshot(output / ".staging") == staged, "something still writes to the staging area"

    # --resume on the engine, its TaskManager / worker killed once it stages a new file.
    victim, replace = _victim_and_replacement(cluster)
    with _KillOnNewStaging(output, set(records.glob("*.tfrecord")), victim, replace) as killer:
        try:
            summary = run([*on_engine, "--resume"])
            recovered_by = "engine retry"
        except JobFailedError:
            # The engine gave up: nothing may be published, and --resume finishes the build.
            # This last one runs in-process (CI time, a job submission less): the staging the
            # engine's workers committed is read by another runner.
            assert not (output / "dataset.json").exists()
            summary = run([*argv, "--resume"])
            recovered_by = "--resume in-process"
    assert killer.killed_at is not None, "the resumed build staged no new record file"
    assert killer.replacement is not None
    assert not is_running(victim)
    assert summary.published, recovered_by
    request.node.user_properties.append(("recovered_by", recovered_by))
    # The user is shown the engine's own job id and where to watch it.
    linked = [r.getMessage() for r in caplog.records if r.getMessage().startswith(engine.title())]
    assert linked and "http://127.0.0.1:" in linked[0], caplog.text
    # A known limit (docs/known-limits.md): dataset.json's lineage counts are the publishing
    # run's Beam counters, so after --resume they differ from an uninterrupted build's. They
    # are set aside (and recorded); every other byte must match.
    lineage = _LINEAGE_COUNTS.findall((output / "dataset.json").read_bytes())
    assert len(lineage) == 2, lineage
    request.node.user_properties.append(("lineage_counts", lineage))
    _assert_identical(output, jvm_references["on_base"], engine, _LINEAGE_COUNTS)
    if engine == "spark":
        # Each executor's stderr starts with its command: the driver (in the job server) gave
        # it the local cluster's JVM options.
        commands = [
            line
            for path in cluster.work_dir.glob("worker-*/app-*/*/stderr")
            for line in path.read_text(errors="replace").splitlines()
            if line.startswith("Spark Executor Command:")
        ]
        assert commands and all(LOCAL_JVM_OPTIONS in line for line in commands), commands
        # The kept driver's settings, which its executors get: the memory fraction among them.
        ui = f"http://127.0.0.1:{cluster.job_server_ui_port}/api/v1/applications"
        apps = portable.http_json(ui)
        assert isinstance(apps, list) and apps, apps
        environment = portable.http_json(f"{ui}/{apps[0]['id']}/environment")
        assert isinstance(environment, dict), environment
        settings = dict(environment["sparkProperties"])
        assert settings["spark.memory.fraction"] == SPARK_MEMORY_FRACTION.split("=", 1)[1]
        heartbeat, whole = SPARK_HEARTBEAT_WHOLE.removeprefix("-D").split("=", 1)
        assert settings[heartbeat] == whole

"""Start and stop a Flink session cluster and a Spark standalone cluster on 127.0.0.1.

Both use what ``scripts/engines/install.sh`` installed (see ``beam_pipelines.engines.versions``)
and ports the kernel just handed out, so that two clusters (or a cluster and a Spark worker UI on
Flink's default 8081) never collide. Every process runs in its own session, logs to the
cluster's work directory, and is found again through a ``cluster.json`` written there, so
``scripts/engines/cluster.py stop DIR`` stops a cluster that another process started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from beam_pipelines.engines import versions

__all__ = [
    "LOCAL_JVM_OPTIONS",
    "FlinkCluster",
    "SparkCluster",
    "free_port",
    "is_running",
    "read_cluster",
    "start_flink_taskmanager",
    "start_spark_worker",
    "local_flink_cluster",
    "local_spark_cluster",
    "start_flink",
    "start_spark",
    "stop_cluster",
]

HOST = "127.0.0.1"
_STATE = "cluster.json"
# The JVM module openings Flink's own config.yaml ships (Java 17), and those Beam's Spark job
# server adds for Spark.
_JAVA17_OPENS = " ".join(
    f"--add-opens=java.base/{package}=ALL-UNNAMED"
    for package in (
        "java.lang",
        "java.lang.invoke",
        "java.lang.reflect",
        "java.io",
        "java.net",
        "java.nio",
        "java.text",
        "java.time",
        "java.util",
        "java.util.concurrent",
        "java.util.concurrent.atomic",
        "sun.nio.ch",
        "sun.nio.cs",
        "sun.security.action",
        "sun.util.calendar",
    )
)


# A local cluster runs short jobs on one machine, where most of a JVM's CPU goes to compiling
# its own code: every JVM of it (JobManager, TaskManagers, Spark master, workers and executors,
# and the job server its runner_args start) compiles with C1 only, no C2. Measured on 2 cores:
# a Spark build resumed through a killed worker took 87 s and 63 CPU-s instead of 160 s and
# 94 CPU-s. A production cluster keeps its own JVM options.
LOCAL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


# The executor's heap (Spark's default 1g): it holds Beam's queues of the SDK workers' output
# (about 1 GB for each task under way), as the TaskManager's does (see _flink_config); 1536m
# failed at 1 M simulated images. The worker offers _SPARK_WORKER_MEMORY.
_SPARK_EXECUTOR_MEMORY = "-Dspark.executor.memory=3g"
# Beam's Spark runner spills the datasets it caches (``--storage_level MEMORY_AND_DISK``) with
# the driver's serializer; Java serialization refuses Beam's RawUnionValue, which failed a
# 1 M-image build as soon as a block went to disk. Kryo writes it.
SPARK_KRYO = "-Dspark.serializer=org.apache.spark.serializer.KryoSerializer"
SPARK_SPILLING_STORAGE = "MEMORY_AND_DISK"
# Spark's unified memory (its caches and its shuffles' buffers) is spark.memory.fraction of the
# executor's heap, 0.6 unless set; the rest holds the tasks' own objects, among them Beam's
# queues of the SDK workers' output. At 10 M images with 0.6 the caches held 9.2 M elements as
# objects, the old generation stayed full and one stage spent 45 % of its time in GC; with 0.25
# what does not fit spills sooner, and the same stage spent 5 % (docs/scale.md).
SPARK_MEMORY_FRACTION = "-Dspark.memory.fraction=0.25"
# Every 10 s an executor's heartbeat asks each running task's accumulators whether they are
# zero, to leave those out. Spark registers an accumulator while the task is still
# deserializing it (apache/spark#58785, open), and Beam's (MetricsContainerStepMapAccumulator)
# then has no value yet: isZero throws, the heartbeat thread dies, and two minutes later the
# driver drops the executor and recomputes what it held (a 10 M-image build lost 10 minutes so,
# after about 15,000 tasks). Sent whole, as before Spark 3.0, nothing asks.
SPARK_HEARTBEAT_WHOLE = "-Dspark.executor.heartbeat.dropZeroAccumulatorUpdates=false"
_SPARK_WORKER_MEMORY = "4g"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class FlinkCluster:
    """A running Flink session cluster: one JobManager and ``len(taskmanager_pids)`` TaskManagers.

    Attributes:
      rest_port: the JobManager's REST port (also its web UI): ``--flink_master 127.0.0.1:PORT``.
      work_dir: configuration, logs and process ids.
      jobmanager_pid: the JobManager's JVM.
      taskmanager_pids: the TaskManagers' JVMs.
      slots: task slots per TaskManager.
    """

    rest_port: int
    work_dir: Path
    jobmanager_pid: int
    taskmanager_pids: tuple[int, ...]
    slots: int
    kind: str = field(default="flink")
    job_server_port: int | None = None
    job_server_pid: int | None = None

    @property
    def master(self) -> str:
        """The value for ``--flink_master``."""
        return f"{HOST}:{self.rest_port}"

    @property
    def web_ui(self) -> str:
        """The Flink web UI (the REST endpoint serves it)."""
        return f"http://{HOST}:{self.rest_port}"

    def runner_args(
        self, parallelism: int | None = None, *, kept_job_server: bool = True
    ) -> list[str]:
        """Pipeline options that send a pipeline to this cluster, one task per slot of the
        TaskManagers still running (``taskmanager_pids`` keeps those that were stopped: a job
        asking for their slots too would wait for slots that never come).

        With ``kept_job_server`` (and the cluster's job server running) the job goes through
        the job server the cluster keeps (``--job_endpoint``); otherwise the launcher starts
        one for the job, as it does for a cluster started elsewhere."""
        live = sum(1 for pid in self.taskmanager_pids if is_running(pid))
        slots = parallelism or self.slots * max(live, 1)
        job_server = _job_server_args(self.job_server_port, self.job_server_pid)
        return [
            "--runner",
            "FlinkRunner",
            "--flink_master",
            self.master,
            *(job_server if kept_job_server else []),
            f"--job_server_jvm_properties={LOCAL_JVM_OPTIONS}",
            "--parallelism",
            str(slots),
        ]

    def logs(self, tail: int = 3000) -> str:
        """The tail of every log of the cluster, for failure messages."""
        return _log_tails(self.work_dir, tail)


@dataclass(frozen=True)
class SparkCluster:
    """A running Spark standalone master and one worker.

    Attributes:
      master_port: the master's RPC port: ``--spark_master_url spark://127.0.0.1:PORT``.
      master_ui_port: the master's web UI.
      work_dir: logs, worker scratch space and process ids.
      master_pid: the master's JVM.
      worker_pids: the workers' JVMs.
      cores: cores each worker offers.
    """

    master_port: int
    master_ui_port: int
    work_dir: Path
    master_pid: int
    worker_pids: tuple[int, ...]
    cores: int
    kind: str = field(default="spark")
    job_server_port: int | None = None
    job_server_pid: int | None = None
    job_server_ui_port: int | None = None

    @property
    def master_url(self) -> str:
        """The value for ``--spark_master_url``."""
        return f"spark://{HOST}:{self.master_port}"

    @property
    def web_ui(self) -> str:
        """The master's web UI."""
        return f"http://{HOST}:{self.master_ui_port}"

    def runner_args(self, *, kept_job_server: bool = True) -> list[str]:
        """Pipeline options that send a pipeline to this cluster. The job server runs the
        Spark driver, which starts the executors with ``spark.executor.extraJavaOptions``.

        With ``kept_job_server`` (and the cluster's job server running) the job goes through
        the job server the cluster keeps (``--job_endpoint``; its driver's web UI is named by
        ``spark.ui.port``, which that job server was started with)."""
        job_server = _job_server_args(self.job_server_port, self.job_server_pid)
        if job_server and kept_job_server:
            ui = f"--job_server_jvm_properties=-Dspark.ui.port={self.job_server_ui_port}"
            # That driver runs Kryo (SPARK_KRYO), so Beam's caches may spill.
            return ["--runner", "SparkRunner", "--spark_master_url", self.master_url,
                    *job_server, ui, f"--storage_level={SPARK_SPILLING_STORAGE}"]  # fmt: skip
        return [
            "--runner",
            "SparkRunner",
            "--spark_master_url",
            self.master_url,
            f"--job_server_jvm_properties={LOCAL_JVM_OPTIONS}",
            f"--job_server_jvm_properties=-Dspark.executor.extraJavaOptions={LOCAL_JVM_OPTIONS}",
            f"--job_server_jvm_properties={_SPARK_EXECUTOR_MEMORY}",
        ]

    def logs(self, tail: int = 3000) -> str:
        """The tail of every log of the cluster, for failure messages."""
        return _log_tails(self.work_dir, tail)


def _log_tails(work_dir: Path, tail: int) -> str:
    logs = sorted(work_dir.glob("**/*.log")) + sorted(work_dir.glob("**/*.out"))
    return "\n".join(f"== {p}\n{p.read_text(errors='replace')[-tail:]}" for p in logs)


def _job_server_args(port: int | None, pid: int | None) -> list[str]:
    """``--job_endpoint`` of a cluster's kept job server, if it has one that still runs."""
    if port is None or pid is None or not is_running(pid):
        return []
    return ["--job_endpoint", f"{HOST}:{port}"]


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
        return True
    return False


# Beam's Flink job server with an invoker that ships no jars with a job (the cluster's lib/ has
# them): built by scripts/engines/install.sh from scripts/engines/java/ when javac is there.
_SESSION_JOB_SERVER = "session-job-server.jar"
_SESSION_JOB_SERVER_MAIN = "tfrecord.engines.FlinkJobServerForSessionCluster"


def _flink_job_server_command() -> list[str]:
    """How the kept Flink job server runs: the session-cluster driver when it was built."""
    jar = versions.flink_job_server_jar()
    session = jar.parent / _SESSION_JOB_SERVER
    if session.exists():
        return ["-cp", f"{session}{os.pathsep}{jar}", _SESSION_JOB_SERVER_MAIN]
    return ["-jar", str(jar)]


def _start_job_server(
    work_dir: Path, main: list[str], engine_args: list[str], properties: list[str]
) -> tuple[int, int]:
    """Starts a Beam job server for the cluster in ``work_dir``, kept until the cluster stops.

    A job server serves any number of jobs; one started per job (what Beam's runners do without
    ``--job_endpoint``) costs every job its JVM's start, its classpath scan and a cold JIT.

    Args:
      main: what follows the JVM options: ``-jar JAR``, or ``-cp PATH CLASS``.

    Returns:
      ``(pid, job port)``, once the job port accepts connections.
    """
    from beam_pipelines.engines.portable import JAVA17_JOB_SERVER_OPENS

    port = free_port()
    artifacts = work_dir / "job-server-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    cmd = [
        "java", *JAVA17_JOB_SERVER_OPENS, LOCAL_JVM_OPTIONS, *properties, *main,
        *engine_args, "--artifacts-dir", str(artifacts), "--job-port", str(port),
        "--artifact-port", str(free_port()), "--expansion-port", str(free_port()),
    ]  # fmt: skip
    pid = _spawn(cmd, work_dir / "log" / "job-server.log", _java_env(), work_dir)
    _wait(lambda: _port_open(port), [pid], "the job server", work_dir, 60.0)
    return pid, port


def _require(path: Path, what: str) -> None:
    if not path.exists():
        raise FileNotFoundError(
            f"{what} is not installed ({path} is missing); run {versions.INSTALL_COMMAND}"
        )


def _java_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if "JAVA_HOME" not in env:
        java = Path(subprocess.check_output(["readlink", "-f", "/usr/bin/java"], text=True).strip())
        env["JAVA_HOME"] = str(java.parent.parent)
    return env


def _spawn(cmd: list[str], log: Path, env: dict[str, str], cwd: Path) -> int:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )
    return proc.pid


def is_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A child that exited but was not reaped yet is a zombie: not alive either.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def _http_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


def _wait(ready, pids: list[int], what: str, work_dir: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        dead = [pid for pid in pids if not is_running(pid)]
        if dead or time.monotonic() > deadline:
            reason = f"process {dead} exited" if dead else f"not ready after {timeout_s:.0f} s"
            raise RuntimeError(f"{what} did not come up: {reason}\n{_log_tails(work_dir, 3000)}")
        time.sleep(0.25)


def _flink_config(work_dir: Path, *, rpc_port: int, rest_port: int, slots: int) -> str:
    settings = {
        "jobmanager.rpc.address": HOST,
        "jobmanager.rpc.port": rpc_port,
        "jobmanager.bind-host": HOST,
        "jobmanager.memory.process.size": "1024m",
        "jobmanager.execution.failover-strategy": "region",
        "taskmanager.bind-host": HOST,
        "taskmanager.host": HOST,
        "taskmanager.numberOfTaskSlots": slots,
        # Beam's runner and an SDK worker exchange data over gRPC, and each side queues what
        # the other has not taken yet: the TaskManager what a worker emits, on its heap (up to
        # 100 messages of up to 10 MB for each bundle under way: about 1 GB a slot), and what
        # it sends a worker, in Netty's direct buffers. With Flink's split of 1600m (a 322 MB
        # heap, 128 MB of direct memory beside the network buffers), and again with a 1 GB
        # heap, simulated builds of 1 M images failed with OutOfMemoryError ("Java heap space"
        # as the workers' output arrived, "Direct buffer memory" as a stage's input left): their
        # workers emit metadata faster than a stage writes it out. So 1280 MB of task heap a
        # slot. Direct memory: the runner sends a worker up to 100 messages before it checks
        # that the worker keeps up (Beam's DirectStreamObserver), and a message holds at least
        # one element: a bucket of the near-duplicate search, about N / 25,000 entries of 50 B
        # (6 MB at 3 M images; --near_duplicate_bucket_entries caps it). A 3 M build on 6
        # slots ran out with 256 MB a slot, so 768 MB a slot (docs/scale.md). The sorts of the
        # batch shuffle use the managed memory and spill to io.tmp.dirs past it. Flink derives
        # the process size: these + 256 network + 2 x 128 framework + 256 metaspace + overhead.
        "taskmanager.memory.task.heap.size": f"{1280 * slots}m",
        "taskmanager.memory.task.off-heap.size": f"{768 * slots}m",
        "taskmanager.memory.managed.size": "512m",
        # Beam's batch translation has many blocking exchanges, and Flink's sort shuffle asks
        # 512 network buffers for each by default: more than a small TaskManager has.
        "taskmanager.memory.network.min": "256m",
        "taskmanager.memory.network.max": "256m",
        "taskmanager.network.sort-shuffle.min-buffers": 64,
        "rest.address": HOST,
        "rest.bind-address": HOST,
        "rest.port": rest_port,
        "parallelism.default": slots,
        "io.tmp.dirs": str(work_dir / "tmp"),
        # A lost TaskManager is noticed in seconds, not the default 50 s, and the job restarts
        # on the slots that are left or come back.
        "heartbeat.interval": 2000,
        "heartbeat.timeout": 8000,
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": 3,
        "restart-strategy.fixed-delay.delay": "2 s",
        # Log4j writes Flink's log to log/flink-*-<standalonesession|taskexecutor>-*.log; the
        # console (the .log this module captures) keeps only warnings, not a second copy.
        "env.java.opts.all": f"{_JAVA17_OPENS} {LOCAL_JVM_OPTIONS} -Dconsole.log.level=WARN",
        # Beam's runner comes from the cluster's own lib/ (see _flink_lib), so that its SDK
        # worker processes are kept for the whole job instead of being started for every stage:
        # Beam keeps them only when its classes are on Flink's parent classloader.
        "classloader.resolve-order": "parent-first",
    }
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in settings.items())


def _flink_ready(rest_port: int, slots_total: int) -> bool:
    overview = _http_json(f"http://{HOST}:{rest_port}/overview")
    return overview is not None and overview.get("slots-total", 0) >= slots_total


def start_flink_taskmanager(cluster: FlinkCluster) -> int:
    """Starts one more TaskManager for ``cluster`` (a replacement after a crash); its pid."""
    home = versions.flink_home()
    env = _flink_env(cluster.work_dir)
    n = len(list((cluster.work_dir / "log").glob("taskmanager-*.log")))
    cmd = ["bash", str(home / "bin" / "taskmanager.sh"), "start-foreground"]
    pid = _spawn(cmd, cluster.work_dir / "log" / f"taskmanager-{n}.log", env, cluster.work_dir)
    _record_pid(cluster.work_dir, "taskmanager_pids", pid)
    return pid


def _flink_env(work_dir: Path) -> dict[str, str]:
    env = _java_env()
    env.update(
        FLINK_HOME=str(versions.flink_home()),
        FLINK_CONF_DIR=str(work_dir / "conf"),
        FLINK_LOG_DIR=str(work_dir / "log"),
        FLINK_LIB_DIR=str(work_dir / "lib"),
        # Flink numbers its log files from a pid file, by default in /tmp and shared by every
        # cluster on the host; and it names them after $USER, which a service may not have.
        FLINK_PID_DIR=str(work_dir),
        FLINK_IDENT_STRING=getpass.getuser(),
    )
    return env


def _cluster_jars(job_server_lib: Path) -> Path:
    """The Beam part of the job server's classpath as files of a directory of their own.

    The cluster's ``lib/`` links to these, not to ``job_server_lib``: the JVM follows a link to
    the jar's real directory and resolves the jar's manifest ``Class-Path`` there, and
    ``beam-sdks-java-core`` names ``slf4j-api-2.0.16.jar``. Found beside it, that SLF4J 2 API
    came before the SLF4J 1.7 API in ``flink-dist``, ignored Flink's Log4j binding (an SLF4J 1.7
    one) and logged nothing: Log4j never started, and Flink wrote no log file. Here the
    job server's own SLF4J, Log4j, Flink and Scala jars are absent, so the names resolve to
    nothing and the cluster's own win. Hard links (copies across file systems), made once.
    """
    target = job_server_lib.parent / "cluster-lib"
    if target.is_dir():
        return target
    own = ("flink-", "scala-", "slf4j-", "log4j-", "jcl-over-slf4j")
    build = job_server_lib.parent / f"cluster-lib.tmp-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir()
    for jar in job_server_lib.glob("*.jar"):
        if jar.name.startswith(own):
            continue
        try:
            os.link(jar, build / jar.name)
        except OSError:
            shutil.copy2(jar, build / jar.name)
    try:
        build.rename(target)
    except OSError:  # another cluster start made it meanwhile
        shutil.rmtree(build, ignore_errors=True)
    return target


def _flink_lib(work_dir: Path) -> None:
    """Links Flink's lib/ and the Beam part of the job server's classpath into ``work_dir/lib``.

    The job server's own Flink, Scala and logging jars stay out: the cluster has its own.
    """
    lib = work_dir / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    job_server_lib = versions.flink_job_server_jar().parent / "lib"
    _require(job_server_lib, f"The Flink {versions.FLINK_MINOR} job server")
    jars = list((versions.flink_home() / "lib").glob("*.jar"))
    jars += list(_cluster_jars(job_server_lib).glob("*.jar"))
    for jar in jars:
        link = lib / jar.name
        if not link.exists():
            link.symlink_to(jar)


def start_flink(
    work_dir: Path,
    *,
    slots: int = 2,
    taskmanagers: int = 1,
    timeout_s: float = 90.0,
    job_server: bool = True,
) -> FlinkCluster:
    """Starts a Flink session cluster on 127.0.0.1 and waits until every slot is registered.

    Args:
      work_dir: configuration, logs and process ids go here (created if missing).
      slots: task slots per TaskManager.
      taskmanagers: TaskManager processes.
      timeout_s: how long to wait for the cluster.
      job_server: also start a Beam job server for the cluster, kept until it stops, which
        ``runner_args`` sends jobs to.

    Returns:
      The running cluster; its ``cluster.json`` in ``work_dir`` lets ``stop_cluster`` find it.

    Raises:
      ValueError: ``slots`` or ``taskmanagers`` is below 1.
      FileNotFoundError: Flink is not installed (names the install command).
      RuntimeError: a process exited or the slots did not register in time (with the logs).
    """
    if slots < 1 or taskmanagers < 1:
        raise ValueError(f"slots={slots} and taskmanagers={taskmanagers} must both be >= 1")
    home = versions.flink_home()
    _require(home / "bin" / "jobmanager.sh", f"Flink {versions.FLINK_VERSION}")
    work_dir = work_dir.resolve()
    for sub in ("conf", "log", "tmp"):
        (work_dir / sub).mkdir(parents=True, exist_ok=True)
    rest_port, rpc_port = free_port(), free_port()
    (work_dir / "conf" / "config.yaml").write_text(
        _flink_config(work_dir, rpc_port=rpc_port, rest_port=rest_port, slots=slots)
    )
    for name in ("log4j-console.properties", "log4j-cli.properties"):
        (work_dir / "conf" / name).write_bytes((home / "conf" / name).read_bytes())
    with (work_dir / "conf" / "log4j-console.properties").open("a") as log4j:
        # Beam's operator names are longer than the 80 characters Flink's metrics keep, and
        # Flink warns of each one, for every task: two screens per job.
        log4j.write(
            "\nlogger.metricnames.name = org.apache.flink.metrics.MetricGroup\n"
            "logger.metricnames.level = ERROR\n"
        )
    _flink_lib(work_dir)
    env = _flink_env(work_dir)
    jm = _spawn(
        ["bash", str(home / "bin" / "jobmanager.sh"), "start-foreground"],
        work_dir / "log" / "jobmanager.log",
        env,
        work_dir,
    )
    cluster = FlinkCluster(rest_port, work_dir, jm, (), slots)
    _write_state(cluster)
    tms = tuple(start_flink_taskmanager(cluster) for _ in range(taskmanagers))
    cluster = FlinkCluster(rest_port, work_dir, jm, tms, slots)
    _wait(
        lambda: _flink_ready(rest_port, slots * taskmanagers),
        [jm, *tms],
        f"Flink at {cluster.web_ui}",
        work_dir,
        timeout_s,
    )
    if job_server:
        _require(versions.flink_job_server_jar(), f"The Flink {versions.FLINK_MINOR} job server")
        pid, port = _start_job_server(
            work_dir, _flink_job_server_command(), ["--flink-master", cluster.master], []
        )
        cluster = dataclasses.replace(cluster, job_server_port=port, job_server_pid=pid)
        _write_state(dataclasses.replace(read_cluster(work_dir), job_server_port=port,
                                         job_server_pid=pid))  # fmt: skip
    return cluster


def _spark_env(work_dir: Path) -> dict[str, str]:
    env = _java_env()
    env.update(
        SPARK_HOME=str(versions.spark_home()),
        SPARK_LOCAL_IP=HOST,
        SPARK_LOG_DIR=str(work_dir / "log"),
        # Where executors write shuffle files and spilled blocks: the cluster's directory, on a
        # disk the caller chose, not /tmp.
        SPARK_LOCAL_DIRS=str(work_dir / "local"),
        SPARK_NO_DAEMONIZE="1",
        SPARK_DAEMON_JAVA_OPTS=LOCAL_JVM_OPTIONS,  # the master and the workers
    )
    return env


def _spark_alive_workers(ui_port: int) -> int:
    state = _http_json(f"http://{HOST}:{ui_port}/json/")
    if not state:
        return 0
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


def start_spark_worker(cluster: SparkCluster) -> int:
    """Starts one more worker for ``cluster`` (a replacement after a crash); its pid."""
    home = versions.spark_home()
    n = len(list((cluster.work_dir / "log").glob("worker-*.log")))
    scratch = cluster.work_dir / f"worker-{n}"
    scratch.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(home / "bin" / "spark-class"),
        "org.apache.spark.deploy.worker.Worker",
        cluster.master_url,
        "--host",
        HOST,
        "--port",
        str(free_port()),
        "--webui-port",
        str(free_port()),
        "--cores",
        str(cluster.cores),
        "--memory",
        _SPARK_WORKER_MEMORY,
        "--work-dir",
        str(scratch),
    ]
    log = cluster.work_dir / "log" / f"worker-{n}.log"
    pid = _spawn(cmd, log, _spark_env(cluster.work_dir), cluster.work_dir)
    _record_pid(cluster.work_dir, "worker_pids", pid)
    return pid


def start_spark(
    work_dir: Path,
    *,
    cores: int = 2,
    timeout_s: float = 90.0,
    job_server: bool = True,
    job_server_properties: Sequence[str] = (),
) -> SparkCluster:
    """Starts a Spark standalone master and one worker on 127.0.0.1, waits for the worker.

    Args:
      work_dir: logs, worker scratch space and process ids go here (created if missing).
      cores: cores the worker offers (executors get one task per core).
      timeout_s: how long to wait for the worker to register.
      job_server: also start a Beam job server (the Spark driver) for the cluster, kept until
        it stops, which ``runner_args`` sends jobs to.
      job_server_properties: more Spark settings for that driver (``-Dspark.NAME=VALUE``),
        for example ``-Dspark.default.parallelism=N``.

    Returns:
      The running cluster; its ``cluster.json`` in ``work_dir`` lets ``stop_cluster`` find it.

    Raises:
      ValueError: ``cores`` is below 1.
      FileNotFoundError: Spark is not installed (names the install command).
      RuntimeError: a process exited or the worker did not register in time (with the logs).
    """
    if cores < 1:
        raise ValueError(f"cores={cores} must be >= 1")
    home = versions.spark_home()
    _require(home / "bin" / "spark-class", f"Spark {versions.SPARK_VERSION}")
    work_dir = work_dir.resolve()
    for sub in ("log", "local"):
        (work_dir / sub).mkdir(parents=True, exist_ok=True)
    port, ui_port = free_port(), free_port()
    master = _spawn(
        [
            str(home / "bin" / "spark-class"),
            "org.apache.spark.deploy.master.Master",
            "--host",
            HOST,
            "--port",
            str(port),
            "--webui-port",
            str(ui_port),
        ],
        work_dir / "log" / "master.log",
        _spark_env(work_dir),
        work_dir,
    )
    cluster = SparkCluster(port, ui_port, work_dir, master, (), cores)
    _write_state(cluster)
    worker = start_spark_worker(cluster)
    cluster = SparkCluster(port, ui_port, work_dir, master, (worker,), cores)
    _wait(
        lambda: _spark_alive_workers(ui_port) >= 1,
        [master, worker],
        f"Spark at {cluster.master_url}",
        work_dir,
        timeout_s,
    )
    if job_server:
        cluster = _start_spark_job_server(cluster, job_server_properties)
    return cluster


def _start_spark_job_server(cluster: SparkCluster, more: Sequence[str]) -> SparkCluster:
    """``cluster`` with a job server of its own: one Spark driver, and one Spark application
    (its executors, their JIT and loaded classes) kept for every job it runs."""
    jar = versions.spark_job_server_jar()
    driver_ui = free_port()
    properties = [
        # What prepare_spark_options gives a job server started for one job (the executors
        # load Beam's classes from the same install), and the driver's web UI.
        f"-Dspark.executor.extraClassPath={jar.parent / 'lib'}/*",
        f"-Dspark.executor.extraJavaOptions={LOCAL_JVM_OPTIONS}",
        _SPARK_EXECUTOR_MEMORY,
        SPARK_KRYO,
        SPARK_MEMORY_FRACTION,
        SPARK_HEARTBEAT_WHOLE,
        f"-Dspark.ui.port={driver_ui}",
        # Beam's Spark runner then keeps its SparkContext between jobs instead of starting a
        # new application (and new executor JVMs) for each; the name is Beam's, from its tests.
        "-Dbeam.spark.test.reuseSparkContext=true",
        # Given settings come last: of two -D flags for one property, the JVM keeps the last.
        *more,
    ]
    engine_args = ["--spark-master-url", cluster.master_url]
    _require(jar, "The Spark job server")
    pid, port = _start_job_server(cluster.work_dir, ["-jar", str(jar)], engine_args, properties)
    kept: dict[str, Any] = dict(
        job_server_port=port, job_server_pid=pid, job_server_ui_port=driver_ui
    )
    _write_state(dataclasses.replace(read_cluster(cluster.work_dir), **kept))
    return dataclasses.replace(cluster, **kept)


def _write_state(cluster: FlinkCluster | SparkCluster) -> None:
    state = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cluster).items()}
    (cluster.work_dir / _STATE).write_text(json.dumps(state, indent=2) + "\n")


def _record_pid(work_dir: Path, key: str, pid: int) -> None:
    # Replacement processes join cluster.json, so that stop_cluster stops them too.
    state = json.loads((work_dir / _STATE).read_text())
    state[key] = [*state[key], pid]
    (work_dir / _STATE).write_text(json.dumps(state, indent=2) + "\n")


def read_cluster(work_dir: Path) -> FlinkCluster | SparkCluster:
    """The cluster whose ``cluster.json`` is in ``work_dir``.

    Raises:
      FileNotFoundError: no cluster was started there.
    """
    state = json.loads((work_dir / _STATE).read_text())
    kind = state.pop("kind")
    state["work_dir"] = Path(state["work_dir"])
    pids_key = "taskmanager_pids" if kind == "flink" else "worker_pids"
    state[pids_key] = tuple(state[pids_key])
    return FlinkCluster(**state) if kind == "flink" else SparkCluster(**state)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop_cluster(cluster: FlinkCluster | SparkCluster, *, extra_pids: tuple[int, ...] = ()) -> None:
    """Stops every process of ``cluster`` (and ``extra_pids``): SIGTERM, then SIGKILL after 10 s."""
    if isinstance(cluster, FlinkCluster):
        pids = [*cluster.taskmanager_pids, cluster.jobmanager_pid]
    else:
        pids = [*cluster.worker_pids, cluster.master_pid]
    # The job server first: it is the Spark driver, and a client of Flink's JobManager.
    kept = [cluster.job_server_pid] if cluster.job_server_pid else []
    pids = [*extra_pids, *kept, *pids]
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(is_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids:
        if is_running(pid):
            _signal_group(pid, signal.SIGKILL)


@contextlib.contextmanager
def local_flink_cluster(
    work_dir: Path, *, slots: int = 2, job_server: bool = True
) -> Iterator[FlinkCluster]:
    """``start_flink`` for the block; stops the cluster (replacement TaskManagers too) after."""
    cluster = start_flink(work_dir, slots=slots, job_server=job_server)
    try:
        yield cluster
    finally:
        stop_cluster(read_cluster(cluster.work_dir))


@contextlib.contextmanager
def local_spark_cluster(
    work_dir: Path,
    *,
    cores: int = 2,
    job_server: bool = True,
    job_server_properties: Sequence[str] = (),
) -> Iterator[SparkCluster]:
    """``start_spark`` for the block; stops the cluster (replacement workers too) after."""
    cluster = start_spark(
        work_dir, cores=cores, job_server=job_server, job_server_properties=job_server_properties
    )
    try:
        yield cluster
    finally:
        stop_cluster(read_cluster(cluster.work_dir))

"""The versions that go together on the Flink and Spark engines, and where they are installed.

Beam's Python SDK here is 2.77.0. Beam's own job-server jars (of any release) are not served by
the Maven registry this project reaches, so ``scripts/engines/install.sh`` assembles each job
server from the newest Beam runner artifacts that it does serve: ``beam-runners-flink-1.19`` and
``beam-runners-spark-3`` at 2.70.0, with ``beam-runners-java-job-service`` at 2.65.0 (no later
one is served). The job server and the cluster run the same Flink (or Spark and Scala) patch
release.

``python3 beam_pipelines/engines/versions.py`` (any Python, no imports of the project) prints these as shell assignments, for the scripts.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

__all__ = [
    "BEAM_JOB_SERVICE_VERSION",
    "BEAM_RUNNER_VERSION",
    "FLINK_MINOR",
    "FLINK_VERSION",
    "INSTALL_COMMAND",
    "SLF4J_VERSION",
    "SPARK_SCALA",
    "SPARK_VERSION",
    "engines_home",
    "flink_home",
    "flink_job_server_jar",
    "spark_home",
    "spark_job_server_jar",
]

BEAM_RUNNER_VERSION = "2.70.0"
BEAM_JOB_SERVICE_VERSION = "2.65.0"
FLINK_MINOR = "1.19"
FLINK_VERSION = "1.19.3"  # apache-flink and apache-flink-libraries, and the job server's Flink
SPARK_VERSION = "3.5.0"  # pyspark, and the job server's Spark (the same Scala 2.12 patch)
SPARK_SCALA = "2.12"
SLF4J_VERSION = "2.0.16"
INSTALL_COMMAND = "bash scripts/engines/install.sh"


def engines_home() -> Path:
    """Where the engines are installed: ``$TFRECORD_ENGINES_HOME``, else a per-user cache."""
    configured = os.environ.get("TFRECORD_ENGINES_HOME")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "tfrecord-engines"


def flink_home() -> Path:
    """The ``FLINK_HOME`` made of the ``apache-flink`` and ``apache-flink-libraries`` wheels."""
    return engines_home() / f"flink-{FLINK_VERSION}" / "pyflink"


def spark_home() -> Path:
    """The ``SPARK_HOME`` inside the ``pyspark`` package."""
    return engines_home() / f"spark-{SPARK_VERSION}" / "pyspark"


def flink_job_server_jar() -> Path:
    """The Flink job server: a jar whose manifest names its main class and its classpath."""
    return (
        engines_home()
        / "job-servers"
        / f"flink-{FLINK_MINOR}"
        / f"beam-flink-{FLINK_MINOR}-job-server-{BEAM_RUNNER_VERSION}.jar"
    )


def spark_job_server_jar() -> Path:
    """The Spark job server: a jar whose manifest names its main class and its classpath."""
    return (
        engines_home()
        / "job-servers"
        / "spark-3"
        / f"beam-spark-3-job-server-{BEAM_RUNNER_VERSION}.jar"
    )


def _shell_assignments() -> str:
    values = {
        "BEAM_RUNNER_VERSION": BEAM_RUNNER_VERSION,
        "BEAM_JOB_SERVICE_VERSION": BEAM_JOB_SERVICE_VERSION,
        "FLINK_MINOR": FLINK_MINOR,
        "FLINK_VERSION": FLINK_VERSION,
        "SPARK_VERSION": SPARK_VERSION,
        "SPARK_SCALA": SPARK_SCALA,
        "SLF4J_VERSION": SLF4J_VERSION,
        "ENGINES_HOME": str(engines_home()),
        "FLINK_HOME_DIR": str(flink_home()),
        "SPARK_HOME_DIR": str(spark_home()),
        "FLINK_JOB_SERVER_JAR": str(flink_job_server_jar()),
        "SPARK_JOB_SERVER_JAR": str(spark_job_server_jar()),
    }
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in values.items())


if __name__ == "__main__":
    sys.stdout.write(_shell_assignments())

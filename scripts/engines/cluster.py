"""Start, stop or show a local Flink session cluster or Spark standalone cluster (127.0.0.1).

Usage::

  python scripts/engines/cluster.py start flink DIR [--slots 2] [--no_job_server]
  python scripts/engines/cluster.py start spark DIR [--cores 2] [--no_job_server]
      [--spark_property=-Dspark.default.parallelism=N]
  python scripts/engines/cluster.py status DIR
  python scripts/engines/cluster.py stop DIR

``start`` prints the pipeline options that send a job to the cluster, for example
``--runner FlinkRunner --flink_master 127.0.0.1:PORT --job_endpoint 127.0.0.1:PORT2
--parallelism 2``, and its web UI. The cluster keeps a Beam job server that every job goes
through (``--job_endpoint``), so that no job pays for starting one; ``--no_job_server`` leaves
it out (each launcher then starts its own). DIR holds the cluster's configuration, logs and
``cluster.json``. Install first: scripts/engines/install.sh.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from beam_pipelines.engines.local_clusters import (
    read_cluster,
    start_flink,
    start_spark,
    stop_cluster,
)


def _describe(cluster) -> str:
    return f"{' '.join(cluster.runner_args())}\nweb UI: {cluster.web_ui}\nlogs: {cluster.work_dir}"


def main(argv: Sequence[str] | None = None) -> int:
    """Parses the command and runs it; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start a cluster and print its pipeline options")
    start.add_argument("engine", choices=("flink", "spark"))
    start.add_argument("dir", type=Path)
    start.add_argument("--slots", type=int, default=2, help="Flink task slots (2)")
    start.add_argument("--cores", type=int, default=2, help="Spark worker cores (2)")
    start.add_argument(
        "--spark_property", action="append", default=[], metavar="-Dspark.NAME=VALUE",
        help="a setting for the Spark job server the cluster keeps (its driver), e.g. "
        "-Dspark.default.parallelism=20 for a build of 1 M images (repeatable)",
    )  # fmt: skip
    start.add_argument(
        "--no_job_server", action="store_true",
        help="start no job server with the cluster: each launcher starts one for its job",
    )  # fmt: skip
    for name in ("stop", "status"):
        commands.add_parser(name, help=f"{name} the cluster in DIR").add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            kept = not args.no_job_server
            if args.engine == "flink":
                cluster = start_flink(args.dir, slots=args.slots, job_server=kept)
            else:
                cluster = start_spark(
                    args.dir, cores=args.cores, job_server=kept,
                    job_server_properties=args.spark_property,
                )  # fmt: skip
            print(_describe(cluster))
        elif args.command == "status":
            print(_describe(read_cluster(args.dir)))
        else:
            stop_cluster(read_cluster(args.dir))
            print(f"stopped the cluster in {args.dir}")
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

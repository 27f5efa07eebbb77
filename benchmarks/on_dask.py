"""Runs the pipeline on a local Dask cluster that this process starts and stops itself.

A scheduler and two single-threaded workers on loopback (``tests/fixtures/dask_cluster.py``),
all children of this process, so a memory sampler of this process sees every one of them
(``bench_scale memory --modes dask``).

Usage::

  python -m benchmarks.on_dask PIPELINE_FLAGS...
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    from beam_pipelines import images_to_tfrecord
    from tests.fixtures.dask_cluster import local_dask_cluster

    flags = list(sys.argv[1:] if argv is None else argv)
    with local_dask_cluster(2) as cluster:
        return images_to_tfrecord.main([*flags, *cluster.runner_args()])


if __name__ == "__main__":
    sys.exit(main())

"""A benchmark sent SIGTERM leaves nothing running: its ``with`` blocks (the local clusters it
started) run on the way out, and the build it measures goes with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]

# A benchmark in miniature: a block that must run on the way out (where a cluster would be
# stopped) around a measured run of a child that would sleep for a minute.
_BENCHMARK = textwrap.dedent(
    """
    import sys
    from benchmarks.bench_scale import measured_run
    from benchmarks.common import exit_on_sigterm

    exit_on_sigterm()
    try:
        measured_run(["-c", "import time; time.sleep(60)"], module="timeit", cwd=sys.argv[2])
    finally:
        open(sys.argv[1], "w").write("stopped")
    """
)


def _child_of(pid: int, timeout_s: float = 30.0) -> psutil.Process:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = psutil.Process(pid).children()
        if children:
            return children[0]
        time.sleep(0.05)
    raise AssertionError(f"process {pid} started no child in {timeout_s} s")


def test_sigterm_runs_the_way_out_and_stops_the_measured_build(tmp_path):
    marker = tmp_path / "stopped"
    bench = subprocess.Popen(
        [sys.executable, "-c", _BENCHMARK, str(marker), str(REPO)], cwd=REPO, env=os.environ
    )
    try:
        child = _child_of(bench.pid)
        time.sleep(0.5)  # the child is running python, not still being forked
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        if bench.poll() is None:
            bench.kill()
    assert marker.read_text() == "stopped"  # where a benchmark stops its cluster
    gone, alive = psutil.wait_procs([child], timeout=10)
    assert not alive, f"the measured run {child.pid} outlived its benchmark"

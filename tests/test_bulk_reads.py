"""gRPC bulk reads for service consumers: the environment it sets, and that gRPC takes it up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tfrecord_io.service.client import BULK_READ_EXPERIMENTS, enable_bulk_reads


def test_requests_both_experiments_in_an_empty_environment():
    env: dict[str, str] = {}
    assert enable_bulk_reads(env)
    assert env["GRPC_EXPERIMENTS"].split(",") == list(BULK_READ_EXPERIMENTS)


def test_keeps_experiments_already_listed_and_adds_each_once():
    env = {"GRPC_EXPERIMENTS": "event_engine_client, tcp_rcv_lowat"}
    assert enable_bulk_reads(env)
    assert env["GRPC_EXPERIMENTS"].split(",") == [
        "event_engine_client",
        "tcp_rcv_lowat",
        "tcp_frame_size_tuning",
    ]
    assert enable_bulk_reads(env)  # idempotent
    assert env["GRPC_EXPERIMENTS"].count("tcp_rcv_lowat") == 1


@pytest.mark.parametrize("off", ["-tcp_rcv_lowat", "-tcp_frame_size_tuning"])
def test_an_experiment_turned_off_is_left_off(off: str):
    env = {"GRPC_EXPERIMENTS": off}
    assert not enable_bulk_reads(env)
    assert env == {"GRPC_EXPERIMENTS": off}


# After importing TensorFlow (as the trainer does), before the first gRPC use: gRPC logs the
# experiments it turned on when it starts.
_CHILD = """
import os, sys
import tensorflow as tf
if sys.argv[1] == "on":
    from tfrecord_io.service.client import enable_bulk_reads
    assert enable_bulk_reads()
server = tf.data.experimental.service.DispatchServer()
print("serving", server.target, flush=True)
"""


def _grpc_experiments_line(mode: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    env.update(GRPC_VERBOSITY="debug", TF_CPP_MIN_LOG_LEVEL="0")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "serving grpc://" in proc.stdout, proc.stdout
    # "gRPC experiments: x:on, ...; default-enabled: ..." when asked for any, else
    # "gRPC experiments enabled: ..." (the defaults).
    lines = [line for line in proc.stderr.splitlines() if "gRPC experiments" in line]
    assert lines, proc.stderr[-3000:]
    return lines[0]


# Two fresh processes that import the storage client: in the whole suite only.
@pytest.mark.slow
def test_grpc_turns_the_experiments_on_only_when_asked():
    on = _grpc_experiments_line("on")
    off = _grpc_experiments_line("off")
    for name in BULK_READ_EXPERIMENTS:
        assert f"{name}:on" in on, on
        assert f"{name}:on" not in off, off

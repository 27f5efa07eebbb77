#!/usr/bin/env bash
# The whole suite (what CI runs, via .ci/run): installs the pinned dev set into .venv (and
# Debian's chromium for the HTML report test, Java 17, Maven, Flink and Spark for the engine
# tests), lints, type-checks and runs every test.
#
#   bash scripts/test.sh            the whole suite
#   bash scripts/test.sh --fast     the inner loop: ruff, then every test not marked slow
#                                   (no browser, no engine clusters, no process chains)
#   bash scripts/test.sh [--fast] ARGS...   ARGS go to pytest (a file, -k, -n 0, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi
if [ "$fast" = 0 ] && { ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; }; then
  echo "Installing Debian's chromium and chromium-driver (browser tests)..."
  _sudo=""; [ "$(id -u)" -ne 0 ] && _sudo="sudo"
  $_sudo apt-get update -qq && $_sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi
if [ "$fast" = 0 ] && { ! command -v java >/dev/null || ! command -v mvn >/dev/null; }; then
  echo "Installing Debian's Java 17 and Maven (Flink and Spark tests)..."
  _sudo=""; [ "$(id -u)" -ne 0 ] && _sudo="sudo"
  $_sudo apt-get update -qq && $_sudo apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
fi
source scripts/bootstrap.sh dev
# Python writes its bytecode caches (.venv and the checkout's __pycache__/) even where the
# environment says not to: otherwise each of the suite's hundreds of Python processes compiles
# Beam and TensorFlow from source again (about 10 CPU-s a process on this project's machines).
unset PYTHONDONTWRITEBYTECODE
# TensorFlow's C++ info lines off in the processes tests and benchmarks start by hand (the
# commands keep them out themselves, unless this is set by the user).
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# Flink, Spark and Beam's job servers for them, pinned, outside .venv (once; then a second).
[ "$fast" = 1 ] || bash scripts/engines/install.sh
ruff check .
ruff format --check .
markers=()
mypy_pid=""
if [ "$fast" = 1 ]; then
  markers=(-m "not slow")
else
  # The packages, as [tool.mypy] in pyproject.toml lists them; in the background while the
  # first tests start (its output is shown after pytest's).
  mypy_log="$(mktemp)"
  # Its cache lives beside the engines, outside the checkout, so that a fresh clone checks only
  # the modules whose contents changed (mypy compares hashes): 16 CPU-s cold, 0.5 s warm.
  mypy --cache-dir "${XDG_CACHE_HOME:-$HOME/.cache}/tfrecord-mypy" >"$mypy_log" 2>&1 &
  mypy_pid=$!
fi
# One pytest worker per logical CPU (at most 4: each worker imports TensorFlow and Beam); a worker
# that runs out of tests takes half of what another still has queued, so the long end-to-end
# tests do not leave a core idle at the end. Pass -n 0 to run in one process.
status=0
python -m pytest -n logical --maxprocesses 4 --dist worksteal "${markers[@]}" "$@" || status=$?
if [ -n "$mypy_pid" ]; then
  mypy_status=0
  wait "$mypy_pid" || mypy_status=$?
  echo "mypy: $(tail -n 1 "$mypy_log")"
  if [ "$mypy_status" != 0 ]; then
    cat "$mypy_log"
    [ "$status" != 0 ] || status=$mypy_status
  fi
  rm -f "$mypy_log"
fi
exit "$status"

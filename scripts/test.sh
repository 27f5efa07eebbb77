#!/usr/bin/env bash
# Installs the pinned dev set into .venv (and Debian's chromium for the HTML report test),
# lints, type-checks and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "Installing Debian's chromium and chromium-driver (browser tests)..."
  _sudo=""; [ "$(id -u)" -ne 0 ] && _sudo="sudo"
  $_sudo apt-get update -qq && $_sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi
if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  echo "Installing Debian's Java 17 and Maven (Flink and Spark tests)..."
  _sudo=""; [ "$(id -u)" -ne 0 ] && _sudo="sudo"
  $_sudo apt-get update -qq && $_sudo apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
fi
source scripts/bootstrap.sh dev
# Flink, Spark and Beam's job servers for them, pinned, outside .venv (once; then a second).
bash scripts/engines/install.sh
ruff check .
ruff format --check .
mypy  # the packages, as [tool.mypy] in pyproject.toml lists them
# One pytest worker per logical CPU (at most 4: each worker imports TensorFlow and Beam); a worker
# that runs out of tests takes half of what another still has queued, so the long end-to-end
# tests do not leave a core idle at the end. Pass -n 0 to run in one process.
python -m pytest -n logical --maxprocesses 4 --dist worksteal "$@"

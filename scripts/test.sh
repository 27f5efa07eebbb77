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
source scripts/bootstrap.sh dev
ruff check .
ruff format --check .
mypy  # the packages, as [tool.mypy] in pyproject.toml lists them
python -m pytest "$@"

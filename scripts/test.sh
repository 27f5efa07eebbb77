#!/usr/bin/env bash
# Installs the pinned dev set into .venv, lints, and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh dev
ruff check .
ruff format --check .
python -m pytest "$@"

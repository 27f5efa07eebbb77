#!/usr/bin/env bash
# The fast loop against the previous Beam release: a second venv, .venv-beam-2.76.0, with the
# same pins as .venv but apache-beam 2.76.0 (and what it needs that differs:
# constraints-beam-2.76.0.txt), then `scripts/test.sh --fast` in it.
#
#   bash scripts/test_beam_previous.sh                 ruff, then every test not marked slow
#   bash scripts/test_beam_previous.sh ARGS...         ARGS go to pytest (a file, -k, -n 0, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
beam="2.76.0"
overlay="constraints-beam-$beam.txt"
# constraints.txt without the packages the overlay pins: uv refuses two pins of one package.
names="$(grep -vE '^\s*(#|$)' "$overlay" | sed -E 's/[=<>[].*//' | paste -sd'|')"
derived="$(mktemp --suffix=.txt)"
trap 'rm -f "$derived"' EXIT
grep -viE "^($names)==" constraints.txt >"$derived"
export VENV=".venv-beam-$beam" CONSTRAINTS="$derived" UV_OVERRIDE="$overlay"
bash scripts/test.sh --fast "$@"

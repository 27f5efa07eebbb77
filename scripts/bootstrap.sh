# Sourced by the quickstart and test scripts: makes .venv with the pinned packages, once.
# Usage: source scripts/bootstrap.sh runtime|dev
set -euo pipefail
_profile="${1:-runtime}"
_req="requirements.txt"
[ "$_profile" = "dev" ] && _req="requirements-dev.txt"
_venv="${VENV:-.venv}"
if [ ! -x "$_venv/bin/python" ]; then
  python3.11 -m venv "$_venv" 2>/dev/null || python3 -m venv "$_venv"
fi
_stamp="$_venv/.installed-$_profile-$(cat requirements.txt requirements-dev.txt constraints.txt pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$_stamp" ]; then
  echo "Installing $_req into $_venv (first run takes a few minutes)..."
  # pip itself is pinned like everything else, so a new pip release cannot change an install.
  "$_venv/bin/python" -m pip install --quiet "pip==26.3" "setuptools==80.9.0"
  "$_venv/bin/python" -m pip install --quiet -r "$_req" -c constraints.txt
  "$_venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
  touch "$_stamp"
fi
export PATH="$PWD/$_venv/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

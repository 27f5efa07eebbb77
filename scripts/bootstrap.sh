# Sourced by the quickstart and test scripts: makes .venv with the pinned packages, once.
# Usage: source scripts/bootstrap.sh runtime|dev|bench
set -euo pipefail
_profile="${1:-runtime}"
_req="requirements.txt"
[ "$_profile" = "dev" ] && _req="requirements-dev.txt"
[ "$_profile" = "bench" ] && _req="requirements-bench.txt"
_venv="${VENV:-.venv}"
# A second venv against other pins (scripts/test_beam_previous.sh): CONSTRAINTS replaces
# constraints.txt, and UV_OVERRIDE names uv's overrides (pins that win over requirements).
_constraints="${CONSTRAINTS:-constraints.txt}"
_overrides=()
if [ -n "${UV_OVERRIDE:-}" ]; then _overrides=(--override "$UV_OVERRIDE"); fi
if [ ! -x "$_venv/bin/python" ]; then
  python3.11 -m venv "$_venv" 2>/dev/null || python3 -m venv "$_venv"
fi
_stamp="$_venv/.installed-$_profile-$(cat requirements.txt requirements-dev.txt requirements-bench.txt "$_constraints" ${UV_OVERRIDE:+"$UV_OVERRIDE"} pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$_stamp" ]; then
  echo "Installing $_req into $_venv (first run takes a few minutes)..."
  # pip, setuptools and uv are pinned like everything else. uv installs the pinned set: the
  # same packages pip resolves (constraints.txt pins every one), in a tenth of pip's time.
  "$_venv/bin/python" -m pip install --quiet "pip==26.3" "setuptools==80.9.0" "uv==0.13.9"
  # uv reads its own settings: hand it pip's extra wheel directory and the system's CAs.
  if [ -n "${PIP_FIND_LINKS:-}" ] && [ -z "${UV_FIND_LINKS:-}" ]; then
    export UV_FIND_LINKS="$PIP_FIND_LINKS"
  fi
  _uv=("$_venv/bin/uv" pip install --python "$_venv/bin/python" --native-tls --quiet)
  "${_uv[@]}" -r "$_req" -c "$_constraints" ${_overrides[@]+"${_overrides[@]}"}
  # compat: a .pth file naming this checkout, the one editable mode setuptools does not
  # announce with a notice on every install.
  "${_uv[@]}" --no-deps --no-build-isolation -e . --config-settings editable_mode=compat
  touch "$_stamp"
fi
case "$_venv" in
  /*) export PATH="$_venv/bin:$PATH" ;;
  *) export PATH="$PWD/$_venv/bin:$PATH" ;;
esac

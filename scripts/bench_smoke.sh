#!/usr/bin/env bash
# A smoke run of every benchmark in benchmarks/: each with its smallest sizes, so a change that
# breaks a benchmark's harness shows up in minutes. The figures it prints mean nothing; the
# real runs, and the tables they fill, are in docs/benchmarks.md.
#
#   bash scripts/bench_smoke.sh            every benchmark
#   bash scripts/bench_smoke.sh reader ... only these (names without the bench_ prefix)
#
# Exits non-zero if any benchmark failed; its output is kept under $BENCH_SMOKE_LOGS
# (default: a temporary directory, printed at the end).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh bench
# Bytecode caches written (see test.sh): without them each benchmark process compiles Beam and
# TensorFlow from source.
unset PYTHONDONTWRITEBYTECODE
# TensorFlow's C++ info lines off in the processes tests and benchmarks start by hand (the
# commands keep them out themselves, unless this is set by the user).
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
logs="${BENCH_SMOKE_LOGS:-$(mktemp -d -t bench-smoke-XXXX)}"
mkdir -p "$logs"

declare -A runs=(
  [catalog]="--rows 20000 --n 12 --rounds 1"
  [decode_bounds]="--n 6 --rounds 1"
  [delivery]="--n 2000 --rounds 1"
  [diff]="--examples 20000"
  [engines]="--quick"
  [images]="--quick --rows throughput"
  [incremental]="--n 24"
  [inspect]="--quick"
  [jvm_engines]="--quick"
  [manifest_scale]="--shards 2000 --repeats 1"
  [metadata_scale]="--sizes 5000 --modes inprocess"
  [near_dup_recall]="--thresholds 8"
  [near_duplicates]="--quick"
  [object_store]="--quick"
  [pipeline]="--quick"
  [reader]="--quick"
  [scale]="overhead --n 24 --repeats 1"
  [service]="--quick"
  [torch_decode]="--quick"
  # Our rows only: the peers' rows need their own venv (.venv-peers, a 6 GB torch install).
  [torch_loaders]="--quick --rows ours_torch,ours_tf"
  [trainer]="--quick"
  [verify]="--shards 100"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || mapfile -t names < <(printf '%s\n' "${!runs[@]}" | sort)
failed=()
for name in "${names[@]}"; do
  if [ -z "${runs[$name]+set}" ]; then
    echo "unknown benchmark '$name'; known: ${!runs[*]}" >&2
    exit 2
  fi
  start=$(date +%s)
  # shellcheck disable=SC2086  # the arguments are words on purpose
  if python -m "benchmarks.bench_$name" ${runs[$name]} >"$logs/$name.log" 2>&1; then
    echo "ok      bench_$name ($(($(date +%s) - start)) s)"
  else
    echo "FAILED  bench_$name ($(($(date +%s) - start)) s): $logs/$name.log"
    failed+=("$name")
  fi
done
echo "logs: $logs"
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }

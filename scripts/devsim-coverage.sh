#!/usr/bin/env bash
# Line coverage of the CUDA host code under the device simulator (tests/gpu/devsim/, label devsim):
# the files of the CUDA backend, the NCCL communicator, the pool, graph capture and the entry points'
# stream contract, as compiled into the simulated libmoe with MOE_DEVSIM_COVERAGE=ON and exercised by
# `ctest -L devsim` in that build. Prints one line per file and the total; exits 1 when the total is
# below the minimum (default 90%).
#   scripts/devsim-coverage.sh BUILD_DIR [MIN_PERCENT]
set -euo pipefail
build=${1:?usage: devsim-coverage.sh BUILD_DIR [MIN_PERCENT]}
min=${2:-90}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# absolute: gcov runs in a scratch directory (its -n still opens files there), so a relative build
# directory would name nothing
build=$(cd "$build" 2>/dev/null && pwd) || { echo "devsim-coverage: build directory ${1} not found" >&2; exit 2; }
objdir="$build/tests/gpu/devsim/CMakeFiles/moe_devsim_core.dir/__/__/__"
files=(src/backend/cuda/cuda_backend.c src/backend/cuda/gemm_lt.c src/backend/cuda/gemm_q.c src/backend/cuda/cuda_status.c
       src/comm/comm_nccl.c src/runtime/pool.c src/core/graph.c src/runtime/entry.c src/runtime/workspace.c)
if [[ ! -d "$objdir" ]]; then
  echo "devsim-coverage: $objdir not found (configure with -DMOE_DEVSIM_COVERAGE=ON and run ctest -L devsim)" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total=0
hit=0
printf '%-36s %8s %8s\n' "file" "lines" "covered"
for f in "${files[@]}"; do
  o="$objdir/$(dirname "$f")"
  if [[ ! -f "$o/$(basename "$f").gcda" ]]; then
    echo "devsim-coverage: no coverage data for $f (did the devsim tests run in $build?)" >&2
    exit 2
  fi
  # gcov's output goes to files, not a pipe: its exit status and messages are reported, never lost
  # (a pipe into an awk that stops early can end gcov with SIGPIPE, which pipefail turns into a
  # silent exit of this script)
  if ! (cd "$tmp" && gcov -n -o "$o/$(basename "$f").o" "$root/$f" >"$tmp/gcov.out" 2>"$tmp/gcov.err"); then
    echo "devsim-coverage: gcov failed on $f:" >&2
    cat "$tmp/gcov.err" "$tmp/gcov.out" >&2
    exit 2
  fi
  out=$(awk -v want="$root/$f" '
    /^File / { gsub(/\047/, "", $2); cur = $2 }
    /^Lines executed:/ && cur == want && !done { sub(/Lines executed:/, ""); split($0, a, "% of "); print a[1], a[2]; done = 1 }' \
    "$tmp/gcov.out")
  if [[ -z "$out" ]]; then
    echo "devsim-coverage: gcov printed no line count for $root/$f:" >&2
    cat "$tmp/gcov.err" "$tmp/gcov.out" >&2
    exit 2
  fi
  pct=${out% *}
  n=${out#* }
  h=$(awk -v p="$pct" -v n="$n" 'BEGIN { printf "%d", p * n / 100 + 0.5 }')
  total=$((total + n))
  hit=$((hit + h))
  printf '%-36s %8d %7.2f%%\n' "$f" "$n" "$pct"
done
pct=$(awk -v h="$hit" -v t="$total" 'BEGIN { printf "%.2f", t ? 100 * h / t : 0 }')
printf '%-36s %8d %7s%%\n' "total (device simulator)" "$total" "$pct"
echo "devsim coverage: $hit of $total lines ($pct%), minimum $min%"
awk -v p="$pct" -v m="$min" 'BEGIN { exit !(p + 0 >= m + 0) }' || { echo "devsim coverage below $min%" >&2; exit 1; }

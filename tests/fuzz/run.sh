#!/usr/bin/env bash
# The libFuzzer harnesses of tests/fuzz (README.md there):
#   1. builds them into build-fuzz/ with clang (CPU only; the library's C sources with
#      -fsanitize=fuzzer-no-link,address,undefined, each harness linked with -fsanitize=fuzzer,...);
#   2. replays every regression input (tests/fuzz/regress/<harness>/*): each must pass;
#   3. fuzzes each harness for SECONDS (default 45) on a copy of its seed corpus
#      (tests/fuzz/corpus/<harness>/ -> build-fuzz/corpus/<harness>/; the grown corpus stays there);
#   4. prints one line per harness: executions, rate, crashes, corpus growth.
# Exits non-zero if a regression input fails or a harness crashed (the crashing input is kept under
# build-fuzz/artifacts/<harness>/, and its log under build-fuzz/logs/).
#
#   bash tests/fuzz/run.sh [SECONDS]
# Environment: MOE_FUZZ_ONLY="fuzz_plan fuzz_tensor" runs a subset; MOE_FUZZ_ARGS adds libFuzzer flags
# (e.g. "-jobs=2 -workers=2"); MOE_JOBS sets the build parallelism; MOE_FUZZ_CC the compiler (clang-14).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
secs=${1:-45}
if ! [[ "$secs" =~ ^[0-9]+$ ]] || ((secs < 1)); then
  echo "usage: tests/fuzz/run.sh [seconds >= 1]" >&2
  exit 2
fi
cc=${MOE_FUZZ_CC:-clang-14}
jobs=${MOE_JOBS:-$(nproc 2>/dev/null || echo 2)}
build=$root/build-fuzz

if ! command -v "$cc" >/dev/null 2>&1; then
  echo "tests/fuzz/run.sh: $cc not found (Debian: clang-14 libclang-rt-14-dev libomp-14-dev; scripts/setup-deps.sh)" >&2
  exit 1
fi

# ---------------------------------------------------------------- 1. build
mkdir -p "$build"
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="${cc/clang/clang++}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS="$san -Wno-pass-failed" \
  -DMOE_CUDA=OFF -DMOE_NCCL=OFF -DMOE_MPI=OFF -DMOE_BUILD_TESTS=OFF -DMOE_BUILD_EXAMPLES=OFF \
  -DMOE_BUILD_FUZZERS=ON -DMOE_WERROR=ON >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; exit 1; }
names=()
if [[ -n "${MOE_FUZZ_ONLY:-}" ]]; then
  read -r -a names <<<"$MOE_FUZZ_ONLY"
else
  for src in tests/fuzz/fuzz_*.c; do names+=("$(basename "$src" .c)"); done
fi
# the harnesses only (they link the static library): the shared library would need the sanitizer
# runtimes as shared objects
cmake --build "$build" -j "$jobs" --target "${names[@]}" >"$build/build.log" 2>&1 ||
  { tail -n 60 "$build/build.log" >&2; exit 1; }

# Allocations beyond 1 GiB return NULL (the engine reports MOE_ERR_OUT_OF_MEMORY) instead of killing
# the run; libFuzzer's own -malloc_limit_mb stays above that so it never fires first. The harnesses'
# contexts allocate through a budgeted hook anyway (fuzz_common.h).
export ASAN_OPTIONS="allocator_may_return_null=1:max_allocation_size_mb=1024:detect_leaks=1:handle_abort=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$root/tests/fuzz/lsan.supp:print_suppressions=0"
if command -v llvm-symbolizer-14 >/dev/null 2>&1; then export ASAN_SYMBOLIZER_PATH=$(command -v llvm-symbolizer-14); fi
# -rss_limit_mb: fuzz_config creates and destroys contexts, layers and their threads back to back, and
# under ASan freed memory stays resident (quarantine, allocator caches): a CI run of a41f86e stopped at
# 2060 MB RSS (a jump from 146 MB to 1.1 GB at one input, then steady growth) with 121 MB live, 49 MB
# of it OpenMP runtime state in 49k allocations, and no leak (LeakSanitizer checks every input); the
# same harness peaked at 421-663 MB in 60-120 s runs before and after. 4096 leaves room for that on
# these 24 GiB machines; a single allocation is still capped at 2048 MB.
fuzz_flags=(-rss_limit_mb=4096 -malloc_limit_mb=2048 -timeout=30 -max_len=4096 -print_final_stats=1)

mkdir -p "$build/logs" "$build/artifacts" "$build/corpus"
failed=0

# ---------------------------------------------------------------- 2. regression inputs
for name in "${names[@]}"; do
  bin=$build/tests/fuzz/$name
  [[ -x "$bin" ]] || { echo "tests/fuzz/run.sh: no harness $name" >&2; exit 1; }
  dir=tests/fuzz/regress/$name
  [[ -d "$dir" ]] || continue
  mapfile -t inputs < <(find "$dir" -type f ! -name '*.md' | sort)
  ((${#inputs[@]} > 0)) || continue
  if "$bin" "${fuzz_flags[@]}" "${inputs[@]}" >"$build/logs/$name.regress.log" 2>&1; then
    echo "$name: ${#inputs[@]} regression inputs pass"
  else
    echo "$name: REGRESSION (log: build-fuzz/logs/$name.regress.log)"
    tail -n 40 "$build/logs/$name.regress.log"
    failed=1
  fi
done

# ---------------------------------------------------------------- 3. fuzzing
summary=()
for name in "${names[@]}"; do
  bin=$build/tests/fuzz/$name
  corpus=$build/corpus/$name
  rm -rf "$corpus" "$build/artifacts/$name"
  mkdir -p "$corpus" "$build/artifacts/$name"
  if [[ -d tests/fuzz/corpus/$name ]]; then cp tests/fuzz/corpus/$name/* "$corpus/" 2>/dev/null || true; fi
  seeds=$(find "$corpus" -type f | wc -l)
  log=$build/logs/$name.log
  rc=0
  # shellcheck disable=SC2086
  "$bin" "$corpus" "${fuzz_flags[@]}" -max_total_time="$secs" -artifact_prefix="$build/artifacts/$name/" \
    ${MOE_FUZZ_ARGS:-} >"$log" 2>&1 || rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1 || true)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1 || true)
  if [[ -z "$runs" ]]; then # no final stats (killed): the last status line's count
    runs=$(grep -o '^#[0-9]*' "$log" | tail -n 1 | tr -d '#' || true)
  fi
  # crash-*, leak-*, timeout-*, oom-* (slow-unit-* files are inputs over 10 s that still finished)
  crashes=$(find "$build/artifacts/$name" -type f ! -name 'slow-unit-*' | wc -l)
  if ((rc != 0 && crashes == 0)); then crashes=1; fi
  grown=$(find "$corpus" -type f | wc -l)
  line=$(printf '%s: %s runs in %s s (%s exec/s), %d crashes, corpus %d -> %d' "$name" "${runs:-?}" "$secs" \
    "${rate:-?}" "$crashes" "$seeds" "$grown")
  summary+=("$line")
  echo "$line"
  if ((crashes > 0)); then
    failed=1
    grep -E '^(==[0-9]+==ERROR|SUMMARY|fuzz check failed|.*runtime error)' "$log" | head -n 5 || true
    find "$build/artifacts/$name" -type f ! -name 'slow-unit-*' | sed 's/^/  artifact: /'
    echo "  log: $log"
  fi
done

printf '\n== fuzz summary (%d harnesses, %d s each)\n' "${#names[@]}" "$secs"
for l in "${summary[@]}"; do printf '   %s\n' "$l"; done
exit "$failed"

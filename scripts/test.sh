#!/usr/bin/env bash
# The whole test suite on a fresh machine (CI runs this through .ci/run):
#   1. dependencies (scripts/setup-deps.sh)
#   2. build/       Release, -Werror, CUDA detected (nvcc put on PATH): library (CUDA backend for
#                   90a-real;100a-real;90-virtual), tests, examples, benchmarks; the ptxas register
#                   report of every kernel (build/ptxas-sm90a.md, fails on spills); then ctest (the
#                   kernel simulator's harness runs included; the device simulator's tests, label
#                   devsim: the CUDA host code, NCCL communicator, pool and graphs on stand-ins for
#                   the CUDA runtime, cuBLASLt and NCCL; GPU-labelled tests only where a GPU is), and
#                   the devsim line coverage of the CUDA host code (scripts/devsim-coverage.sh, >= 90%)
#   3. build-asan/  Debug with AddressSanitizer + UBSan, library and tests; ctest -L unit (leaks
#                   checked), ctest -L devsim, then ctest -L mpi with 2 threads per rank
#      valgrind     every unit-labelled test of build/ under valgrind memcheck (tests/valgrind/run.sh:
#                   leaks and memory errors, third-party suppressions only; one line per test)
#      build-fuzz/  fuzz (libFuzzer, ASan+UBSan): tests/fuzz/run.sh 60 builds the harnesses with
#                   clang, replays tests/fuzz/regress, fuzzes each harness 60 s and prints its
#                   execution count (fails on any crash)
#   4. install test (tests/install/run.sh): the installed package as a host project meets it
#   5. ABI check (scripts/abi-check.sh): build/libmoe.so against the committed baseline; and
#      scripts/check-imports.sh: the library imports nothing that aborts, exits or prints
#      scripts/check-floors.sh: no file of src/ uses one on a higher floor, no files in a circle
#   6. language bindings against build/: coverage of abi/moe.h (scripts/check-bindings.sh), then the
#      Rust, Go and Julia test suites (scripts/test-{rust,go,julia}.sh; Go and Julia set up themselves)
# Exits non-zero if any stage fails. MOE_JOBS overrides the build parallelism (default: cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

jobs=${MOE_JOBS:-$(nproc 2>/dev/null || echo 2)}
if [[ -d /usr/local/cuda/bin ]]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
if [[ -d "${CARGO_HOME:-$HOME/.cargo}/bin" ]]; then export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"; fi
export CTEST_OUTPUT_ON_FAILURE=1

t_start=$SECONDS
t_section=$SECONDS
results=()
section() {
  t_section=$SECONDS
  printf '\n========================================================================\n'
  printf '== %s\n' "$*"
  printf '========================================================================\n'
}
done_section() { # name
  results+=("$(printf '%-34s ok   %4ds' "$1" $((SECONDS - t_section)))")
}
summary() {
  local rc=$?
  printf '\n== summary (%ds)\n' $((SECONDS - t_start))
  local r
  for r in "${results[@]}"; do printf '   %s\n' "$r"; done
  if ((rc != 0)); then printf '   FAILED (exit %d) in: %s\n' "$rc" "${current:-?}"; fi
}
trap summary EXIT

# A GPU is present when the driver answers; GPU-labelled tests run only then.
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then have_gpu=1; fi

# ---------------------------------------------------------------- 1. dependencies
current="dependencies"; section "$current"
bash scripts/setup-deps.sh
if command -v nvcc >/dev/null 2>&1; then nvcc --version | tail -n 1; else echo "nvcc: not found (CUDA backend not built)"; fi
echo "GPU present: $have_gpu   build jobs: $jobs"
done_section "$current"

# ---------------------------------------------------------------- 2. main build + tests
current="build (Release, -Werror)"; section "$current"
# -g: debug info for the ABI check (stage 5); it does not change the generated code
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMOE_WERROR=ON -DCMAKE_C_FLAGS=-g -DMOE_DEVSIM_COVERAGE=ON
cmake --build build -j "$jobs"
done_section "$current"

if command -v nvcc >/dev/null 2>&1; then
  # the register report of every CUDA kernel for sm_90a (recorded; fails on spills in kernels/)
  current="ptxas report (sm_90a)"; section "$current"
  bash scripts/ptxas-report.sh --compile --arch 90a --jobs "$jobs" > build/ptxas-sm90a.md
  grep -E "^\*\*Summary" build/ptxas-sm90a.md || tail -n 3 build/ptxas-sm90a.md
  done_section "$current"
fi

current="ctest (build/)"; section "$current"
ctest_args=(--test-dir build --output-on-failure --no-tests=error)
if ((have_gpu == 0)); then ctest_args+=(-LE 'gpu|devsim'); else ctest_args+=(-LE devsim); fi
# Check's 4 s per test is tight for the layer tests on a loaded 2-core machine
CK_TIMEOUT_MULTIPLIER=3 ctest "${ctest_args[@]}"
# the device simulator's tests (label devsim), two at a time: their streams mostly wait
CK_TIMEOUT_MULTIPLIER=3 ctest --test-dir build --output-on-failure --no-tests=error -L devsim -j2
done_section "$current"
# the device simulator's tests ran in that stage (label devsim): their count, and the line coverage
# of the CUDA host code they exercised (scripts/devsim-coverage.sh; fails below 90%)
current="device simulator: coverage"; section "$current"
devsim_tests=$(ctest --test-dir build -N -L devsim | sed -n 's/^Total Tests: //p')
echo "device simulator: $devsim_tests tests (label devsim) ran in the ctest stage above"
bash scripts/devsim-coverage.sh build | tee build/devsim-coverage.txt
done_section "$current"
results+=("  devsim: ${devsim_tests} tests; $(grep -E '^devsim coverage:' build/devsim-coverage.txt)")

# ---------------------------------------------------------------- 3. sanitizers
current="build (ASan+UBSan, Debug)"; section "$current"
# MOE_ROWS_PAR_MIN_BYTES=1: every row copy of the dispatchers takes its OpenMP path, which the small
# test problems would otherwise never reach (the multi-rank tests below run with 2 threads)
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMOE_SANITIZE=ON -DMOE_WERROR=ON \
  -DMOE_CUDA=OFF -DMOE_BUILD_EXAMPLES=OFF -DCMAKE_C_FLAGS=-DMOE_ROWS_PAR_MIN_BYTES=1
cmake --build build-asan -j "$jobs"
done_section "$current"

current="ctest -L unit (build-asan/)"; section "$current"
export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Sanitized Debug code runs several times slower: stretch Check's per-test timeouts accordingly.
export CK_TIMEOUT_MULTIPLIER="${CK_TIMEOUT_MULTIPLIER:-10}"
if [[ -f "$root/tests/lsan.supp" ]]; then
  # leaks inside third-party libraries only (OpenBLAS / libgomp thread pools)
  export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
fi
ctest --test-dir build-asan --output-on-failure --no-tests=error -L unit
unset LSAN_OPTIONS CK_TIMEOUT_MULTIPLIER
done_section "$current"

current="ctest -L devsim (build-asan/)"; section "$current"
# the CUDA host code on the device simulator under ASan+UBSan: its stream workers, fibers and the
# engine's error paths; the harness takes its light cases (MOE_DEVSIM_HARNESS_ARGS), the layer test its
# smaller FP8 shapes (MOE_TEST_LIGHT), and the simulator's random delays are shorter (the sanitizers
# slow every operation down already)
MOE_DEVSIM_DELAY_US=50 CK_TIMEOUT_MULTIPLIER=10 MOE_TEST_LIGHT=1 \
  ctest --test-dir build-asan --output-on-failure --no-tests=error -L devsim -j2
done_section "$current"

current="ctest -L mpi (build-asan/, 2 threads)"; section "$current"
# Address and UB errors in the multi-rank paths (dispatchers, chunked pipeline, comms); leak checking
# is off here because Open MPI's own allocations outlive MPI_Finalize.
# OMP_WAIT_POLICY=PASSIVE: 4 ranks x 2 threads on 2 cores; spinning OpenMP workers made the 4-rank
# chunked test take 104 s instead of 5 s (docs/parallel.md, "Ranks sharing cores")
ASAN_OPTIONS="detect_leaks=0" MOE_TEST_THREADS=2 OMP_WAIT_POLICY=PASSIVE \
  ctest --test-dir build-asan --output-on-failure --no-tests=error -L mpi
unset ASAN_OPTIONS UBSAN_OPTIONS
done_section "$current"

current="valgrind memcheck (build/, ctest -L unit)"; section "$current"
# every unit test of the Release build (it has -g) under memcheck, two at a time; fails on any report
mkdir -p build/valgrind-stage
bash tests/valgrind/run.sh build -j "$jobs" | tee build/valgrind-stage/summary.txt
done_section "$current"
# the totals again in the final summary
while read -r line; do results+=("  $line"); done < <(grep -E '^valgrind: [0-9]+ tests, ' build/valgrind-stage/summary.txt)

current="fuzz (libFuzzer, ASan+UBSan)"; section "$current"
# one line per harness with its execution count (tests/fuzz/README.md); the grown corpora and any
# crashing input stay under build-fuzz/
mkdir -p build-fuzz
bash tests/fuzz/run.sh 60 | tee build-fuzz/summary.txt
done_section "$current"
# the execution counts again in the final summary
while read -r line; do results+=("  $line"); done < <(grep -E '^fuzz_[a-z_]+: ' build-fuzz/summary.txt | grep ' runs in ')

# ---------------------------------------------------------------- 4. install test
current="install test"; section "$current"
bash tests/install/run.sh build
done_section "$current"

# ---------------------------------------------------------------- 5. ABI compatibility
current="ABI check"; section "$current"
bash scripts/abi-check.sh build
bash scripts/check-imports.sh build
bash scripts/check-floors.sh build
done_section "$current"

# ---------------------------------------------------------------- 6. language bindings
current="bindings: ABI coverage"; section "$current"
bash scripts/check-bindings.sh
done_section "$current"

current="bindings: Rust"; section "$current"
bash scripts/test-rust.sh build
done_section "$current"

current="bindings: Go"; section "$current"
bash scripts/test-go.sh build
done_section "$current"

current="bindings: Julia"; section "$current"
bash scripts/test-julia.sh build
done_section "$current"

current=""
printf '\nscripts/test.sh: all stages passed\n'

#!/usr/bin/env bash
# Every unit-labelled CTest test of a build under valgrind memcheck (scripts/test.sh runs it on build/).
#
#   bash tests/valgrind/run.sh BUILD_DIR [-j N] [-R REGEX]
#
# The test list, commands, working directories, environments and pass conditions come from
# `ctest -L unit --show-only=json-v1`, so a new unit test is covered without touching this script.
# Each test runs under
#   valgrind --leak-check=full --errors-for-leak-kinds=definite,indirect --track-origins=no
#            --trace-children=yes (programs of the system, e.g. the sh/grep of a shell test, skipped)
# with one log per process under BUILD_DIR/valgrind/. A test passes when memcheck's ERROR SUMMARY is
# 0 in every log (invalid accesses, uninitialised values that decide anything, bad frees, definite and
# indirect leaks; "still reachable" and "possibly lost" memory is not an error) and the test itself
# passes as CTest would judge it (exit status, PASS_REGULAR_EXPRESSION, WILL_FAIL).
#
# Check programs run with CK_FORK=no: every test case in the one process valgrind watches (forked
# children would otherwise report their leak summaries of the parent's heap), and Check's timeouts,
# which only fork mode enforces, are off; a whole test is limited to VALGRIND_TIMEOUT seconds instead
# (default 1800). OMP_WAIT_POLICY=PASSIVE: valgrind runs one thread at a time, and a spinning OpenMP
# worker would hold that one slot. The kernel simulator's harness runs with --light, as in the
# sanitizer stage (tests/backend/CMakeLists.txt): its heavy cases' coverage is in lighter ones.
# MOE_TEST_LIGHT=1: the unit tests with the longest loops sample fewer inputs (testutil.h tu_light;
# each such test says what it keeps), so that the whole suite fits CI's budget; every test runs.
# OPENBLAS_CORETYPE is left as the machine has it (CI's rule): valgrind emulates OpenBLAS's FMA
# kernels slowly, so the fp64 layers of the light mode are small instead.
# ONEDNN_MAX_CPU_ISA=AVX: oneDNN's AVX GEMM kernels rather than the AVX2 ones it JIT-generates for
# valgrind's CPU. The AVX2 sgemm kernel moves its stack pointer into a buffer oneDNN allocated on the
# heap; memcheck takes that for a stack switch and then reports hundreds of uninitialised values and
# invalid reads inside libdnnl, libgomp and the JIT code (test_quant_layer: 8558 errors, none with a
# libmoe frame on top; with the AVX kernels: none). FMA-free too: the test took 169 s with the AVX2
# kernels, 70 s with these.
# MOE_FAULT_STRIDE=25: test_fault_injection fails every 25th allocation of each walk instead of every
# one (every scenario, source and configuration still walked, from its first allocation on).
#
# Third-party reports only are suppressed (tests/valgrind/memcheck.supp, each entry with its reason).
# Prints one line per test and a total ("valgrind: 40 tests, 0 with reports, 0 failed"); exits 1 if
# any test has reports or fails. -j N runs N tests at a time (default: the number of cores).
set -uo pipefail

usage() { echo "usage: $0 BUILD_DIR [-j N] [-R REGEX]" >&2; exit 2; }
(($# >= 1)) || usage
build=$(cd "$1" && pwd) || usage
shift
jobs=$(nproc 2>/dev/null || echo 2)
regex=""
while (($#)); do
  case "$1" in
    -j) jobs=$2; shift 2 ;;
    -R) regex=$2; shift 2 ;;
    *) usage ;;
  esac
done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v valgrind >/dev/null 2>&1 || { echo "valgrind: not installed (scripts/setup-deps.sh installs it)" >&2; exit 1; }

logdir="$build/valgrind"
rm -rf "$logdir"
mkdir -p "$logdir"

# The longest tests under valgrind, longest first (run.sh's own per-test times): they start first, so
# that -j N does not end with one long test running alone. Any other test follows in CTest's order; a
# name here that the build lacks is ignored.
longest_first=(backend_ops_sim test_determinism test_quant_layer backend_ops test_planner test_fault_injection
               backend_ops_guarded)

# One line per test: name, then fields separated by \x1f: workdir, pass regexes (\x1e-separated; a
# newline in one written as the regex escape \n), will_fail, environment and command (\x1e-separated).
ctest_args=(--test-dir "$build" -L unit --show-only=json-v1)
[[ -n "$regex" ]] && ctest_args+=(-R "$regex")
listing=$(ctest "${ctest_args[@]}" | python3 -c '
import json, sys
US, RS = "\x1f", "\x1e"
first = {n: i for i, n in enumerate(sys.argv[1:])}
tests = json.load(sys.stdin)["tests"]
tests = sorted(tests, key=lambda t: (first.get(t["name"], len(first)), tests.index(t)))
for t in tests:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    lst = lambda v: v if isinstance(v, list) else ([] if v is None else [v])
    print(US.join([t["name"], props.get("WORKING_DIRECTORY", "."),
                   RS.join(r.replace("\n", "\\n") for r in lst(props.get("PASS_REGULAR_EXPRESSION"))),
                   "1" if props.get("WILL_FAIL") else "0",
                   RS.join(lst(props.get("ENVIRONMENT"))),
                   RS.join(t["command"])]))
' "${longest_first[@]}") || { echo "valgrind: could not list the unit tests of $build" >&2; exit 1; }
[[ -n "$listing" ]] || { echo "valgrind: no unit tests in $build" >&2; exit 1; }

vg=(valgrind --tool=memcheck --leak-check=full --errors-for-leak-kinds=definite,indirect
    --show-leak-kinds=definite,indirect --track-origins=no --num-callers=30
    --trace-children=yes "--trace-children-skip=/bin/*,/usr/bin/*,/usr/local/bin/*"
    --suppressions="$here/memcheck.supp" --gen-suppressions=all)

# Runs one test; writes its verdict line into $logdir/NAME.verdict.
run_one() { # line
  local name wd pass willfail envs cmd
  IFS=$'\x1f' read -r name wd pass willfail envs cmd <<<"$1"
  local -a command env_kv pass_res
  IFS=$'\x1e' read -r -a command <<<"$cmd"
  IFS=$'\x1e' read -r -a env_kv <<<"$envs"
  IFS=$'\x1e' read -r -a pass_res <<<"$pass"
  # the simulator's harness: --light, as under the sanitizers
  if [[ "${command[0]}" == */test_backend_ops && " ${command[*]} " == *" --backend-b sim "* ]]; then
    command+=(--light)
  fi
  local out="$logdir/$name.out" t0=$SECONDS rc
  (
    cd "$wd" || exit 125
    exec env CK_FORK=no CK_TIMEOUT_MULTIPLIER=100 OMP_WAIT_POLICY=PASSIVE \
      ONEDNN_MAX_CPU_ISA=AVX MOE_TEST_LIGHT=1 MOE_FAULT_STRIDE=25 "${env_kv[@]}" \
      timeout -k 10 "${VALGRIND_TIMEOUT:-1800}" "${vg[@]}" --log-file="$logdir/$name.vg.%p" "${command[@]}"
  ) >"$out" 2>&1
  rc=$?
  local secs=$((SECONDS - t0))
  # memcheck's verdict: the ERROR SUMMARY of every process of the test. A forked process that exec'd a
  # program valgrind does not trace (the shell's child running grep) ends its log without a summary;
  # the test's own process (whose parent has no log) must have one.
  local errors=0 n logs=0 f pids=" " ppid
  for f in "$logdir/$name".vg.*; do [[ -e "$f" ]] && pids+="${f##*.} "; done
  for f in "$logdir/$name".vg.*; do
    [[ -e "$f" ]] || continue
    logs=$((logs + 1))
    n=$(sed -n 's/.*ERROR SUMMARY: \([0-9][0-9]*\) errors.*/\1/p' "$f" | tail -n 1)
    ppid=$(sed -n 's/^==[0-9]*== Parent PID: \([0-9]*\).*/\1/p' "$f" | head -n 1)
    if [[ -z "$n" && "$pids" != *" $ppid "* ]]; then
      n=1
      echo "(no ERROR SUMMARY: the test's process did not finish under valgrind)" >>"$f"
    fi
    errors=$((errors + ${n:-0}))
  done
  ((logs > 0)) || errors=1
  # the test's own verdict, as CTest judges it
  local ok=1 why=""
  if ((rc == 124 || rc == 137)); then ok=0; why="timed out after ${VALGRIND_TIMEOUT:-1800} s"
  elif ((${#pass_res[@]} > 0)); then
    ok=0
    local re
    for re in "${pass_res[@]}"; do
      if python3 -c 'import re,sys; sys.exit(0 if re.search(sys.argv[1], open(sys.argv[2], errors="replace").read(), re.M) else 1)' \
        "$re" "$out"; then ok=1; fi
    done
    ((ok)) || why="output lacks the pass pattern"
  elif ((willfail)); then
    ((rc != 0)) || { ok=0; why="exit 0 but WILL_FAIL"; }
  elif ((rc != 0)); then ok=0; why="exit $rc"
  fi
  local verdict
  if ((errors > 0)); then verdict=$(printf 'REPORTS (%d errors; %s/%s.vg.*)' "$errors" "$logdir" "$name")
  elif ((!ok)); then verdict="TEST FAILED ($why; $out)"
  else verdict="ok"
  fi
  printf 'valgrind: %-36s %4ds  %s\n' "$name" "$secs" "$verdict" >"$logdir/$name.verdict"
  printf '%d %d\n' $((errors > 0)) $((ok == 0)) >"$logdir/$name.status"
}

t_start=$SECONDS
names=()
running=0
while IFS= read -r line; do
  name=${line%%$'\x1f'*}
  names+=("$name")
  while ((running >= jobs)); do
    wait -n
    running=$((running - 1))
  done
  (run_one "$line"; cat "$logdir/$name.verdict") &
  running=$((running + 1))
done <<<"$listing"
wait

total=${#names[@]} reports=0 failed=0
for name in "${names[@]}"; do
  read -r r f <"$logdir/$name.status" 2>/dev/null || { r=1; f=1; }
  reports=$((reports + r))
  failed=$((failed + f))
done
printf 'valgrind: %d tests, %d with reports, %d failed (%d s, %d at a time; logs in %s)\n' \
  "$total" "$reports" "$failed" $((SECONDS - t_start)) "$jobs" "$logdir"
if ((reports + failed > 0)); then
  for name in "${names[@]}"; do
    read -r r f <"$logdir/$name.status" 2>/dev/null || { r=1; f=1; }
    if ((r + f > 0)); then cat "$logdir/$name.verdict"; fi
  done
  exit 1
fi
exit 0

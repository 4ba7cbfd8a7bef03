#!/bin/sh
# Runs one fault test of test_comm_mpi under mpirun and returns rank 0's verdict.
#   run_fault.sh MPIRUN [ARGS...]   (the full mpirun command line, program and --fault=MODE included)
# After a peer has died or stalled, mpirun's exit status reflects the dead rank rather than the
# check: rank 0 prints "fault verdict: PASS" or "fault verdict: FAIL ..." and that line decides.
# A hard limit (timeout) turns a hang into a failure.
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT
timeout -k 5 90 "$@" >"$log" 2>&1
rc=$?
cat "$log"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "run_fault.sh: the fault test hung (killed after 90 s)"
  exit 1
fi
if grep -q "^fault verdict: PASS" "$log"; then
  exit 0
fi
echo "run_fault.sh: rank 0 did not report PASS (mpirun exit status $rc)"
exit 1

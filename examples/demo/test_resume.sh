#!/bin/sh
# The demo's checkpoints end to end (CTest train_demo_resume; docs/demo.md, "Stopping and resuming"):
#
#   A  train_demo --steps 4 --stop-after 2 --save CK --save-every 1   steps 1-2, saved at 1 and at 2
#   B  train_demo --resume CK --save CK                               steps 3-4 from A's checkpoint
#   C  train_demo --steps 4 --save CK2                                steps 1-4 uninterrupted
#
# on a tiny model (2 layers of 4 experts, top-2). B must end bitwise where C ends: the same loss lines
# for steps 3-4 and the same summary, the same SVG report, the same final host state (host.bin: the
# embedding, head, bias, their Adam moments and the loss history) and record (demo_state.json: step,
# losses, RNG). Then a resume from a missing directory and from a truncated layer file must fail with
# a message (the engine's for the latter) and exit status 1.
#
#   sh examples/demo/test_resume.sh path/to/train_demo
#
# POSIX sh, so that the valgrind stage (tests/valgrind/run.sh) watches the demo and a shell that is
# clean itself.
# shellcheck disable=SC2015 # "A && B || fail ...": fail when any of the checks fails
set -u
demo=${1:?usage: test_resume.sh path/to/train_demo}
# removed when every check passes, kept for a look otherwise (no EXIT trap: dash's subshells would
# leak its string under valgrind)
work=$(mktemp -d "${TMPDIR:-/tmp}/train_demo_resume.XXXXXX") || exit 1
cd "$work" || exit 1
# the OpenMP workers wait passively: the results do not depend on it, the time on a busy machine does
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_WAIT_POLICY
model="--layers 2 --experts 4 --topk 2 --threads 2"
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

run() { # name, then the demo's arguments: stdout in name.out, stderr in name.err
  name=$1
  shift
  "$demo" "$@" --report "$name.svg" >"$name.out" 2>"$name.err"
  rc=$?
  echo "== $name: train_demo $* (exit $rc)"
  cat "$name.out" "$name.err"
  [ "$rc" = 0 ] || fail "run $name exited with $rc"
}

# shellcheck disable=SC2086 # $model is meant to split
run A --steps 4 --stop-after 2 --save ck --save-every 1 $model
run B --resume ck --save ck --threads 2
# shellcheck disable=SC2086
run C --steps 4 --save ck2 $model

# the loss part of the progress lines ("step 3/4  loss 4.157 (floor 1.635, +2.522)") and the summary's
# loss lines, from step 3 on
losses() {
  sed -n -e 's/^\(step [0-9]*\/[0-9]*  loss [^)]*)\).*/\1/p' -e '/^training loss/p' -e '/^expected loss/p' "$1" |
    grep -v '^step [12]/'
}
losses B.out >B.losses
losses C.out >C.losses
grep -q '^step 3/4' B.losses || fail "B printed no line for step 3"
diff B.losses C.losses || fail "the resumed run's loss lines differ from the uninterrupted run's"
grep -q '^resumed from ck (slot-b): step 2 of 4 done' B.out || fail "B did not resume from step 2 (slot-b)"

cmp B.svg C.svg || fail "the reports differ"
cmp ck/slot-a/host.bin ck2/slot-a/host.bin || fail "the final host states (host.bin) differ"
grep -v '"slot"' ck/demo_state.json >B.record
grep -v '"slot"' ck2/demo_state.json >C.record
diff B.record C.record || fail "the final records (demo_state.json) differ"
# the last step's training loss and smoothed loss, each the exact float (%.9g)
final_b=$(grep -E '^  "loss(_smooth)?": ' ck/demo_state.json | tr -d ' \n' | sed 's/,$//')
final_c=$(grep -E '^  "loss(_smooth)?": ' ck2/demo_state.json | tr -d ' \n' | sed 's/,$//')
echo "final losses: resumed $final_b, uninterrupted $final_c"
[ -n "$final_b" ] && [ "$final_b" = "$final_c" ] || fail "final losses: resumed '$final_b', uninterrupted '$final_c'"

# failures: a message and exit status 1, never a crash
"$demo" --resume missing --report D.svg >D.out 2>D.err
rc=$?
cat D.err
[ "$rc" = 1 ] && grep -q 'missing/demo_state.json' D.err || fail "resume from a missing directory: exit $rc"
cp -r ck damaged
slot=$(sed -n 's/^  "slot": "\(.*\)",$/\1/p' damaged/demo_state.json)
for layer in damaged/"$slot"/layer1-*.safetensors; do truncate -s -1 "$layer"; done
"$demo" --resume damaged --report E.svg >E.out 2>E.err
rc=$?
cat E.err
[ "$rc" = 1 ] && grep -q 'moe_layer_load.*MOE_ERR_IO' E.err && grep -q 'engine: .*truncated' E.err ||
  fail "resume from a truncated layer file: exit $rc"

if [ "$failures" -gt 0 ]; then
  echo "train_demo_resume: $failures check(s) failed; the runs' files are in $work"
  exit 1
fi
cd / && rm -rf "$work"
echo "train_demo_resume: the resumed run ends bitwise where the uninterrupted one does"

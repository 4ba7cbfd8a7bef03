#!/usr/bin/env bash
# The Rust binding's tests: generates the reference fixture, runs `cargo test --lib --tests`
# (offline; no crates.io dependencies) in bindings/rust, the compile-fail doctests, then the
# example trainer, which must
# report a falling loss. Cargo's output goes under BUILD_DIR/rust-target, so the checkout stays clean.
#
#   bash scripts/test-rust.sh [BUILD_DIR]      # BUILD_DIR: a built libmoe tree (default: build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
build=$(cd "${1:-build}" && pwd)

command -v cargo >/dev/null || { echo "test-rust: cargo not found" >&2; exit 1; }
lib=$(find "$build" -maxdepth 2 -name 'libmoe.so' -print -quit)
[[ -n "$lib" ]] || { echo "test-rust: no libmoe.so under $build (build the library first)" >&2; exit 1; }
fixture_bin="$build/tests/bindings/moe_fixture"
[[ -x "$fixture_bin" ]] || { echo "test-rust: $fixture_bin missing (build target moe_fixture)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$fixture_bin" "$tmp/fixture.txt"
export MOE_FIXTURE="$tmp/fixture.txt"
export MOE_LIB_DIR
MOE_LIB_DIR=$(dirname "$lib")
export CARGO_TARGET_DIR="$build/rust-target"

cd "$root/bindings/rust"
# cargo's own status, not tee's: read it from PIPESTATUS with pipefail off for this one pipeline
set +o pipefail
cargo test --offline --lib --tests 2>&1 | tee "$tmp/cargo.log"
status=${PIPESTATUS[0]}
set -o pipefail
grep -q '^test result:' "$tmp/cargo.log" || { echo "test-rust: cargo printed no test result" >&2; exit 1; }
((status == 0)) || exit "$status"

# the compile-fail doctests of moe/src/lib.rs: what the safe API's types rule out at compile time
echo "== doctests (compile_fail: borrows, lifetimes, !Sync)"
cargo test --offline --doc -p moe

echo "== example: train"
cargo run --offline --release --quiet --example train | tee "$tmp/train.log"
read -r first last < <(sed -n 's/^initial_loss=\([0-9.e+-]*\) final_loss=\([0-9.e+-]*\)$/\1 \2/p' "$tmp/train.log")
[[ -n "${first:-}" && -n "${last:-}" ]] || { echo "test-rust: train printed no loss summary" >&2; exit 1; }
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.5 * a) }' ||
  { echo "test-rust: loss did not fall enough ($first -> $last)" >&2; exit 1; }
echo "test-rust: ok (loss $first -> $last)"

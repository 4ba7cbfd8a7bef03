#!/usr/bin/env bash
# Tests the Julia binding (bindings/julia) against a built libmoe:
#   1. Julia 1.5.3 (scripts/setup-julia.sh) and tree-sitter-julia from npm, in the tools dir
#   2. every .jl file under bindings/julia parses with tree-sitter-julia (current Julia syntax)
#   3. the shared fixture from BUILD_DIR/tests/bindings/moe_fixture
#   4. bindings/julia/test/runtests.jl under Julia 1.5 against BUILD_DIR's libmoe
#
#   bash scripts/test-julia.sh [BUILD_DIR]     # default: build
#
# Writes nothing inside the repository: the fixture and Julia's depot go to a temporary directory.
# Exits non-zero if any step fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
build=${1:-build}
if [[ ! -d "$build" ]]; then
  echo "test-julia: build directory '$build' does not exist; build libmoe first" >&2
  exit 1
fi
build=$(cd "$build" && pwd)
tools=${MOE_TOOLS_DIR:-/opt/libmoe-tools}
export MOE_TOOLS_DIR=$tools

if [[ ! -f "$build/libmoe.so.0" || ! -x "$build/tests/bindings/moe_fixture" ]]; then
  echo "test-julia: $build has no libmoe.so.0 or tests/bindings/moe_fixture; build libmoe first" >&2
  exit 1
fi

# ---------------------------------------------------------------- 1. tools
julia=$(bash scripts/setup-julia.sh)

# Pinned: the parser's grammar ships a .wasm that this web-tree-sitter loads (no native build needed).
ts_dir=$tools/tree-sitter-julia
ts_pkgs=(web-tree-sitter@0.27.2 tree-sitter-julia@0.23.1)
ts_stamp=$ts_dir/.installed
if [[ ! -f "$ts_stamp" || "$(cat "$ts_stamp")" != "${ts_pkgs[*]}" ]]; then
  echo "test-julia: installing ${ts_pkgs[*]} into $ts_dir" >&2
  mkdir -p "$ts_dir"
  npm install --prefix "$ts_dir" --no-audit --no-fund --no-save --ignore-scripts --loglevel=error \
    "${ts_pkgs[@]}" >&2
  echo "${ts_pkgs[*]}" >"$ts_stamp"
fi

# ---------------------------------------------------------------- 2. syntax (tree-sitter-julia)
mapfile -t jl_files < <(find bindings/julia -name '*.jl' -type f | sort)
NODE_PATH="$ts_dir/node_modules" node bindings/julia/tools/parse-check.js "${jl_files[@]}"

# ---------------------------------------------------------------- 3. fixture
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/tests/bindings/moe_fixture" "$tmp/fixture.txt"

# ---------------------------------------------------------------- 4. tests (Julia 1.5)
export MOE_FIXTURE=$tmp/fixture.txt
export LIBMOE_PATH=$build/libmoe.so.0
# A private depot: the precompile cache of this checkout never mixes with another one's.
export JULIA_DEPOT_PATH=$tmp/depot
"$julia" --project="$root/bindings/julia" "$root/bindings/julia/test/runtests.jl"

# ---------------------------------------------------------------- 5. the README's example, as written
# (the first julia block after "## Example"): the documentation stays true to the package
awk '/^## Example/ {on = 1} on && /^```julia/ {inblk = 1; next} inblk && /^```/ {exit} inblk {print}' \
  "$root/bindings/julia/README.md" >"$tmp/readme_example.jl"
[[ -s "$tmp/readme_example.jl" ]] || { echo "test-julia: no julia example under '## Example' in the README" >&2; exit 1; }
"$julia" --project="$root/bindings/julia" "$tmp/readme_example.jl"
echo "test-julia: README example ran ($(wc -l <"$tmp/readme_example.jl") lines)"

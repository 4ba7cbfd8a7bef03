#!/usr/bin/env bash
# Every arrow one way (docs/architecture.md): read from the built objects, not the sources, so that a
# call without an include (a public ABI function declared in moe.h, say) counts too.
#   scripts/check-floors.sh BUILD_DIR
# Fails when a file of src/ uses a symbol defined by a file on a higher floor, or when files use one
# another in a circle (GNU tsort finds it). Floors, bottom up:
#   base 1 < backend 2 < runtime 3 < comm, parallel 4 < core 5 < plan, ckpt 6 < api 7
set -euo pipefail
build="${1:?usage: $0 BUILD_DIR}"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
floor_of() {
  case "$1" in
    src/base/*) echo 1 ;; src/backend/*) echo 2 ;; src/runtime/*) echo 3 ;;
    src/comm/*|src/parallel/*) echo 4 ;; src/core/*) echo 5 ;; src/plan/*|src/ckpt/*) echo 6 ;; src/api/*) echo 7 ;;
    *) echo 0 ;;
  esac
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# one row per (source file, D|U, symbol); the CPU sources compiled twice (fp32, fp64) read as one file
n=0
while IFS= read -r obj; do
  case "$obj" in
    */moe_cuda.dir/*) src="src/backend/cuda/$(basename "$obj" .o)" ;; # the CUDA backend's own target
    *) src="src/${obj#*/src/}" && src="${src%.o}" ;;
  esac
  [[ -f "$root/$src" ]] || continue # a stale object of a file that moved
  n=$((n + 1))
  nm --defined-only -g "$obj" | awk -v f="$src" 'NF >= 3 {print f, "D", $3}' >>"$tmp/syms"
  nm --undefined-only -g "$obj" | awk -v f="$src" '{print f, "U", $NF}' >>"$tmp/syms"
done < <(find "$build" -name '*.c.o' -path '*/src/*' | sort)
[[ $n -gt 0 ]] || { echo "check-floors: no objects of src/ under $build" >&2; exit 2; }
# edges user -> definer (a symbol several files define, one per dtype, points at each)
awk '$2 == "D" {def[$3] = def[$3] " " $1} $2 == "U" {use[NR] = $1 " " $3}
     END {for (i in use) {split(use[i], u, " "); m = split(def[u[2]], d, " ");
          for (j = 1; j <= m; j++) if (d[j] != u[1]) print u[1], d[j], u[2]}}' "$tmp/syms" | sort -u >"$tmp/edges"
bad=0
# includes too: a struct or an inline function crosses floors without a symbol
while IFS=: read -r file _ inc; do
  to=$(sed -E 's/.*"([a-z_]+)\/.*/src\/\1\//' <<<"$inc")
  if [[ $(floor_of "$file") -lt $(floor_of "$to") ]]; then
    echo "check-floors: $file (floor $(floor_of "$file")) includes ${inc#*#include } (floor $(floor_of "$to")): an arrow back up"
    bad=1
  fi
done < <(cd "$root" && grep -rnE '^#include "[a-z_]+/' src)
while read -r from to sym; do
  if [[ $(floor_of "$from") -lt $(floor_of "$to") ]]; then
    echo "check-floors: $from (floor $(floor_of "$from")) uses $sym of $to (floor $(floor_of "$to")): an arrow back up"
    bad=1
  fi
done <"$tmp/edges"
if ! awk '{print $1, $2}' "$tmp/edges" | sort -u | tsort >/dev/null 2>"$tmp/loops"; then
  echo "check-floors: files that use one another in a circle (tsort):"
  sed 's/^/  /' "$tmp/loops"
  bad=1
fi
[[ $bad -eq 0 ]] || exit 1
echo "check-floors: $n objects, $(wc -l <"$tmp/edges") uses between files, none back up, no circle"

#!/usr/bin/env bash
# ABI compatibility of a built libmoe.so against the committed baseline abi/libmoe.so.0.abi
# (libabigail). Within a major version the ABI may only grow: added functions, fields appended to
# structs (struct_size), new enum constants. abidiff's exit status is a bit field (1/2 tool error,
# 4 some ABI change, 8 an incompatible change); since abidiff counts a moved struct member as a mere
# "change", the report is also read: a removed function or variable, a member whose offset or type
# changed, a deleted member, a changed parameter or return type, or a changed enumerator value fails.
#   scripts/abi-check.sh BUILD_DIR            check (the library needs debug info: -g)
#   scripts/abi-check.sh BUILD_DIR --update   rewrite the baseline (only when the major changes, or to
#                                             record deliberate compatible growth)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:?usage: scripts/abi-check.sh BUILD_DIR [--update]}
lib="$build/libmoe.so"
baseline=abi/libmoe.so.0.abi
[[ -f "$lib" ]] || { echo "abi-check: $lib not found" >&2; exit 1; }
current="$build/libmoe.abi"
abidw --headers-dir abi --out-file "$current" "$lib"
if [[ "${2:-}" == "--update" ]]; then
  cp "$current" "$baseline"
  echo "abi-check: baseline $baseline updated"
  exit 0
fi
[[ -f "$baseline" ]] || { echo "abi-check: no baseline $baseline (run with --update once)" >&2; exit 1; }
set +e
abidiff --headers-dir2 abi "$baseline" "$current" > "$build/abidiff.txt"
rc=$?
set -e
if (( rc & 3 )); then cat "$build/abidiff.txt"; echo "abi-check: abidiff failed (status $rc)" >&2; exit 1; fi
if (( rc & 8 )); then cat "$build/abidiff.txt"; echo "abi-check: INCOMPATIBLE ABI change against $baseline" >&2; exit 1; fi
if (( rc & 4 )); then
  cat "$build/abidiff.txt"
  if grep -Eq "[1-9][0-9]* Removed|offset changed|type of '[^']*' changed|data member deletion|parameter [0-9]+ of type .* changed|return type changed|enumerator .* value changed|was removed" "$build/abidiff.txt"; then
    echo "abi-check: INCOMPATIBLE ABI change against $baseline (only additions are allowed within a major)" >&2
    exit 1
  fi
  echo "abi-check: compatible ABI growth against $baseline (allowed)"
  exit 0
fi
echo "abi-check: ABI identical to $baseline"

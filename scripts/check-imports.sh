#!/usr/bin/env bash
# The library never aborts, exits or prints (DESIGN.md): libmoe.so must not import a function that
# does. Host code that a compiler generates can import them behind our back (nvcc's host stub of a
# non-static __device__ function calls exit), so the built library is checked, not the sources.
#   scripts/check-imports.sh BUILD_DIR
set -euo pipefail
lib="${1:?usage: $0 BUILD_DIR}/libmoe.so"
[[ -e "$lib" ]] || { echo "check-imports: $lib not found" >&2; exit 1; }
forbidden='abort|exit|_exit|_Exit|quick_exit|raise|printf|fprintf|vprintf|vfprintf|dprintf|puts|fputs|putchar|fputc|perror|fwrite|__assert_fail|__printf_chk|__fprintf_chk|__vfprintf_chk|__vprintf_chk|__dprintf_chk'
found=$(nm -D --undefined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | grep -xE "$forbidden" || true)
n=$(nm -D --undefined-only "$lib" | wc -l)
if [[ -n "$found" ]]; then
  echo "check-imports: $lib imports functions that abort, exit or print:"
  echo "$found" | sed 's/^/  /'
  exit 1
fi
echo "check-imports: $lib imports $n symbols, none that aborts, exits or prints"

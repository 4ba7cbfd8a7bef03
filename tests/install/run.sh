#!/usr/bin/env bash
# Install test: installs a configured+built libmoe into a temporary prefix and checks it the way a
# host project meets it.
#   bash tests/install/run.sh [BUILD_DIR]      (default: build)
# Checks: the README example is this folder's readme_example.c; the installed header compiles alone
# (C11 and C++); find_package(moe) consumers (shared, static, README example) build and run, the README
# example also under valgrind memcheck; a pkg-config consumer builds and runs; libmoe.so exports exactly the header's moe_* functions, has
# SONAME libmoe.so.0 and does not need the CUDA driver library.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
cc=${CC:-cc}
cxx=${CXX:-c++}

failures=0
pass() { echo "  ok    $*"; }
fail() { echo "  FAIL  $*"; failures=$((failures + 1)); }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/moe-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"

# ---------------------------------------------------------------- install
if ! cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1; then
  cat "$tmp/install.log"
  echo "install test: cmake --install failed"
  exit 1
fi
lib=$(find "$prefix" -name 'libmoe.so.0' | head -n 1)
if [[ -z "$lib" ]]; then
  echo "install test: no libmoe.so.0 under $prefix:"; find "$prefix" | sed 's/^/    /'
  exit 1
fi
libdir=$(dirname "$lib")
pass "installed into a temporary prefix ($(find "$prefix" -type f | wc -l) files, libdir ${libdir#"$prefix"/})"
for f in include/moe.h "${libdir#"$prefix"/}/libmoe.so" "${libdir#"$prefix"/}/libmoe.a" \
         "${libdir#"$prefix"/}/pkgconfig/moe.pc" "${libdir#"$prefix"/}/cmake/moe/moeConfig.cmake"; do
  if [[ -e "$prefix/$f" ]]; then pass "installed $f"; else fail "missing $f"; fi
done
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export CMAKE_PREFIX_PATH="$prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"

# ---------------------------------------------------------------- README example in sync
# README.md holds the example between the lines "<!-- readme_example.c begin -->" and "... end -->",
# inside a ```c fence.
awk '/<!-- readme_example.c end -->/ {on = 0}
     on && !/^```/ {print}
     /<!-- readme_example.c begin -->/ {on = 1}' "$root/README.md" >"$tmp/readme_example.c"
if [[ ! -s "$tmp/readme_example.c" ]]; then
  fail "README.md has no example between the readme_example.c markers"
elif diff -u "$here/readme_example.c" "$tmp/readme_example.c" >"$tmp/readme.diff"; then
  pass "README.md example == tests/install/readme_example.c"
else
  cat "$tmp/readme.diff"
  fail "README.md example differs from tests/install/readme_example.c (diff above)"
fi

# ---------------------------------------------------------------- the header alone
echo '#include <moe.h>' >"$tmp/header.c"
if "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$prefix/include" "$tmp/header.c"; then
  pass "installed moe.h compiles alone (C11, -Wpedantic -Werror)"
else
  fail "installed moe.h does not compile alone as C11"
fi
cp "$tmp/header.c" "$tmp/header.cpp"
if "$cxx" -std=c++11 -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" "$tmp/header.cpp"; then
  pass "installed moe.h compiles as C++11"
else
  fail "installed moe.h does not compile as C++11"
fi

# ---------------------------------------------------------------- find_package(moe) consumer
run() { # name, command...
  local name=$1; shift
  if "$@" >"$tmp/run.log" 2>&1; then
    pass "$name: $(tail -n 1 "$tmp/run.log")"
  else
    sed 's/^/    /' "$tmp/run.log"
    fail "$name exited non-zero"
  fi
}
if cmake -S "$here" -B "$tmp/consumer" -DCMAKE_BUILD_TYPE=Release >"$tmp/consumer.log" 2>&1 &&
   cmake --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1; then
  pass "find_package(moe) consumer project configured and built"
  run "consumer (moe::moe)" "$tmp/consumer/consumer"
  run "consumer_static (moe::moe_static)" "$tmp/consumer/consumer_static"
  run "readme_example" "$tmp/consumer/readme_example"
  # The same example under valgrind's memcheck, against the installed (optimised) library: no invalid
  # access, no use of uninitialised values, no definite leak (libgomp's thread stacks are "possibly
  # lost" by design and not reported). valgrind.supp: the dynamic loader's word-wise strncmp during
  # cuBLASLt's start-up (third-party, nothing of libmoe's).
  if command -v valgrind >/dev/null 2>&1; then
    run "readme_example under valgrind memcheck" valgrind -q --error-exitcode=99 --leak-check=full \
      --suppressions="$root/tests/install/valgrind.supp" \
      --show-leak-kinds=definite --errors-for-leak-kinds=definite "$tmp/consumer/readme_example"
  else
    fail "valgrind not installed (scripts/setup-deps.sh installs it)"
  fi
else
  sed 's/^/    /' "$tmp/consumer.log"
  fail "find_package(moe) consumer did not configure/build"
fi

# ---------------------------------------------------------------- pkg-config consumer
if flags=$(pkg-config --cflags --libs moe 2>"$tmp/pc.log"); then
  # shellcheck disable=SC2086 # pkg-config output is a word list
  if "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror "$here/main.c" -o "$tmp/consumer_pc" $flags \
       >"$tmp/pc.log" 2>&1; then
    pass "pkg-config consumer built: cc main.c $flags"
    run "consumer (pkg-config)" "$tmp/consumer_pc"
  else
    sed 's/^/    /' "$tmp/pc.log"
    fail "pkg-config consumer did not build"
  fi
else
  sed 's/^/    /' "$tmp/pc.log"
  fail "pkg-config does not find moe"
fi

# ---------------------------------------------------------------- exports, SONAME, NEEDED
# Dynamic symbols defined by the library, without version suffixes or the version node (type A).
nm -D --defined-only --format=posix "$lib" | awk '$2 != "A" {sub(/@.*/, "", $1); print $1}' |
  sort -u >"$tmp/exported"
# Functions the installed header declares.
grep -E '^[[:space:]]*MOE_API[[:space:]]' "$prefix/include/moe.h" | grep -oE '^[^(]*\(' |
  grep -oE '[A-Za-z_][A-Za-z0-9_]*[[:space:]]*\($' | tr -d '( \t' | sort -u >"$tmp/declared"
nexp=$(wc -l <"$tmp/exported")
if ((nexp == 0)); then
  fail "libmoe.so exports no symbols"
elif grep -v '^moe_' "$tmp/exported" >"$tmp/stray"; then
  sed 's/^/    /' "$tmp/stray"
  fail "libmoe.so exports symbols without the moe_ prefix (above)"
else
  pass "libmoe.so exports only moe_* symbols ($nexp)"
fi
if comm -23 "$tmp/declared" "$tmp/exported" >"$tmp/undefined" && [[ -s "$tmp/undefined" ]]; then
  sed 's/^/    /' "$tmp/undefined"
  fail "functions declared in moe.h but not exported by libmoe.so (above)"
else
  pass "every MOE_API function of moe.h is exported ($(wc -l <"$tmp/declared"))"
fi
if comm -13 "$tmp/declared" "$tmp/exported" >"$tmp/extra" && [[ -s "$tmp/extra" ]]; then
  sed 's/^/    /' "$tmp/extra"
  fail "libmoe.so exports moe_* symbols that moe.h does not declare (above)"
else
  pass "libmoe.so exports nothing beyond moe.h"
fi
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
if [[ "$soname" == "libmoe.so.0" ]]; then pass "SONAME $soname"; else fail "SONAME is '$soname', want libmoe.so.0"; fi
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' | tr '\n' ' ')
if [[ " $needed" == *" libcuda.so"* ]]; then
  fail "libmoe.so needs the CUDA driver library (NEEDED: $needed)"
else
  pass "NEEDED: $needed"
fi

if ((failures > 0)); then
  echo "install test: $failures check(s) failed"
  exit 1
fi
echo "install test: all checks passed"

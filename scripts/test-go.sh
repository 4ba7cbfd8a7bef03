#!/usr/bin/env bash
# Tests the Go binding (bindings/go) against a libmoe build directory, without installing anything
# but the Go toolchain:
#
#   scripts/test-go.sh [BUILD_DIR]      # default: build (configured and built already)
#
# Installs golang-go (Debian: Go 1.19) if go is missing, writes the reference fixture with
# BUILD_DIR/tests/bindings/moe_fixture, then runs `go vet` and `go test -v` with cgo's strictest
# pointer checks (GODEBUG=cgocheck=2). Offline: standard library only, GOPROXY=off; Go's caches
# live under BUILD_DIR so the checkout stays clean.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
build=$(cd "${1:-build}" && pwd)

if ! command -v go >/dev/null 2>&1; then
  echo "test-go: installing golang-go"
  log=$(mktemp)
  if ! (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go) >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
  rm -f "$log"
fi
go version

fixture_bin="$build/tests/bindings/moe_fixture"
if [[ ! -x "$fixture_bin" ]]; then
  echo "test-go: $fixture_bin not found: build the library and its tests first" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$fixture_bin" "$tmp/fixture.txt"
export MOE_FIXTURE="$tmp/fixture.txt"

# cgo finds moe.h in the source tree and libmoe.so in the build tree (rpath: no LD_LIBRARY_PATH)
export CGO_ENABLED=1
export CGO_CFLAGS="-I$root/abi"
export CGO_LDFLAGS="-L$build -Wl,-rpath,$build"
export GOFLAGS=-mod=mod GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local
export GOCACHE="$build/go/cache" GOPATH="$build/go/path"

cd "$root/bindings/go"
echo "test-go: go vet ./..."
go vet ./...
echo "test-go: GODEBUG=cgocheck=2 go test -v -count=1 ./..."
GODEBUG=cgocheck=2 go test -v -count=1 ./...

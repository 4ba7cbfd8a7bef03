#!/usr/bin/env bash
# Installs, by Debian package name, everything libmoe's build, tests, demo and benchmarks use.
# Idempotent: when every package is already installed it only checks (dpkg-query) and returns.
# Quiet and non-interactive (works without a TTY, e.g. in CI); apt's log is shown only on failure.
#
#   bash scripts/setup-deps.sh            # install what is missing
#   bash scripts/setup-deps.sh --check    # only report what is missing (exit 1 if anything is)
set -euo pipefail

packages=(
  build-essential   # gcc, make, binutils (objdump, nm, readelf for the install test)
  cmake             # >= 3.25
  pkg-config
  check             # unit test framework
  libdlpack-dev     # dlpack/dlpack.h (v0.6), the tensor exchange format of the ABI
  libopenblas-dev   # CPU GEMMs of fp64 layers (the reference precision)
  libdnnl-dev       # oneDNN: CPU GEMMs of fp32 / bf16 layers
  libjansson-dev    # JSON of the safetensors checkpoint headers (src/ckpt)
  zlib1g-dev        # CRC-32 of checkpoint tensors (src/ckpt)
  ocl-icd-opencl-dev # OpenCL loader: Debian's oneDNN CMake package requires it at configure time
  valgrind          # memcheck over the unit tests (tests/valgrind/run.sh) and the install test
  python3-torch     # PyTorch reference in the benchmarks (run with /usr/bin/python3)
  abigail-tools     # abidiff: ABI compatibility checks
  libopenmpi-dev    # MPI communicators (CPU ranks)
  openmpi-bin       # mpirun for the multi-rank tests (tests/mpi)
  clang-14          # the libFuzzer harnesses (tests/fuzz) ...
  libclang-rt-14-dev # ... their libFuzzer and sanitizer runtimes
  libomp-14-dev     # ... and clang's OpenMP runtime
)
# Strip the comments above: keep the first word of each entry.
names=()
for p in "${packages[@]}"; do names+=("${p%% *}"); done

missing=()
for p in "${names[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  if [[ "$status" != "installed" ]]; then missing+=("$p"); fi
done

if ((${#missing[@]} == 0)); then
  echo "setup-deps: all ${#names[@]} packages present"
  exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
  echo "setup-deps: missing: ${missing[*]}"
  exit 1
fi

echo "setup-deps: installing ${missing[*]}"
sudo=()
if [[ "$(id -u)" -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo -n)
  else
    echo "setup-deps: not root and no sudo; install these packages by hand: ${missing[*]}" >&2
    exit 1
  fi
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
apt_opts=(-q -y -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=600)
if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update >"$log" 2>&1 ||
   ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install "${missing[@]}" \
       >>"$log" 2>&1 </dev/null; then
  cat "$log" >&2
  echo "setup-deps: apt-get failed (log above)" >&2
  exit 1
fi
echo "setup-deps: installed ${#missing[@]} package(s)"

#!/usr/bin/env bash
# Run on a development machine (Debian 12, network) before a GPU session: downloads the Debian
# packages of the engine's CPU-side build dependencies into .gpu-deps/ (about 20 MB, git-ignored), so
# that tests/gpu/run can build on a GPU machine that has only the CUDA image and no network. Carry
# the folder with the device call (carry: [".gpu-deps"]).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pkgs=(libdnnl2 libdnnl-dev libopenblas0 libopenblas0-pthread libopenblas-dev libopenblas-pthread-dev libgfortran5
      libdlpack-dev check libsubunit0 libsubunit-dev ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-c-headers
      opencl-clhpp-headers pkgconf pkgconf-bin libpkgconf3 pkg-config)
mkdir -p .gpu-deps
cd .gpu-deps
apt-get download "${pkgs[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
n=$(ls ./*.deb | wc -l)
echo "fetch-deps: $n packages, $(du -sh . | cut -f1) in .gpu-deps/"
(( n >= ${#pkgs[@]} )) || { echo "fetch-deps: expected ${#pkgs[@]} packages" >&2; exit 1; }

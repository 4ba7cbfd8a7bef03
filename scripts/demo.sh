#!/usr/bin/env bash
# Builds libmoe (Release, in build/) and runs the demo trainer on the CPU.
# Arguments go to the trainer:  bash scripts/demo.sh --help
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup-deps.sh
# nvcc is on PATH only through a login profile; CUDA detection (MOE_CUDA=AUTO) should see it.
if [[ -d /usr/local/cuda/bin ]]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

jobs=${MOE_JOBS:-$(nproc 2>/dev/null || echo 2)}
echo "== configure + build (Release, build/) =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build --target train_demo -j "$jobs"

echo "== build/examples/train_demo $* =="
exec build/examples/train_demo "$@"

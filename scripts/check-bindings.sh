#!/usr/bin/env bash
# Keeps the language bindings in step with abi/moe.h: every MOE_API function must be declared in the
# Rust raw crate (moe-sys), and the Go and Julia packages must call every function their wrappers are
# expected to cover (the list below names the deliberate omissions). Exits non-zero on a gap.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mapfile -t abi < <(grep -oE '^MOE_API [^(]*\(' abi/moe.h | sed -E 's/.*[ *]([a-z_0-9]+)\($/\1/' | sort -u)
echo "abi/moe.h: ${#abi[@]} functions"

# Functions a binding may leave out, with the reason (Go and Julia only; moe-sys declares everything).
declare -A optional=(
  [moe_comm_create_mpi]="needs the host's MPI_Comm; hosts pass it through the raw call"
  [moe_comm_nccl_unique_id]="GPU builds only"
  [moe_comm_create_nccl]="GPU builds only"
  [moe_context_last_error]="moe_last_error (thread-local) always carries the same latest message"
)

fail=0
check() { # name, files..., : pattern prefix
  local lang=$1 pattern=$2; shift 2
  local missing=() f
  for f in "${abi[@]}"; do
    if ! grep -rqE "${pattern//NAME/$f}" "$@" 2>/dev/null; then missing+=("$f"); fi
  done
  local gaps=()
  for f in "${missing[@]}"; do
    if [[ $lang == rust || -z ${optional[$f]+x} ]]; then gaps+=("$f"); fi
  done
  printf '%-6s %d of %d functions bound' "$lang" $(( ${#abi[@]} - ${#missing[@]} )) "${#abi[@]}"
  if ((${#missing[@]} > ${#gaps[@]})); then printf ' (optional, left out: %d)' $(( ${#missing[@]} - ${#gaps[@]} )); fi
  printf '\n'
  if ((${#gaps[@]})); then printf '   missing: %s\n' "${gaps[@]}"; fail=1; fi
}
check rust  '(^|[^a-z_0-9])fn NAME *\(' bindings/rust/moe-sys/src
check go    '(C\.NAME\(|^[^/]*[^a-z_0-9.]NAME\()' bindings/go
check julia '[:(]NAME[(, )]' bindings/julia/src
exit $fail

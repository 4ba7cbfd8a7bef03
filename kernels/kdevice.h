/*
 * Device-wide primitives the launchers call between kernels. On CUDA they are CUB (CCCL, shipped
 * with the toolkit; kernels/kdevice_cub.cu) with temporary storage carved from ex->workspace; in the
 * simulator they are host loops over the same memory (tests/gpu/sim/sim_device.cc), because CUB's
 * device code is not written for the simulator. Same contract as the ops: stream-ordered, no host
 * synchronisation, statuses instead of aborts.
 */
#ifndef MOE_KERNELS_KDEVICE_H
#define MOE_KERNELS_KDEVICE_H

#include "kcommon.cuh"

namespace MOE_KNS {

/* out[0] = 0, out[i + 1] = in[0] + ... + in[i] for i < n: out has n + 1 elements (out[n] = total).
 * n >= 1. in and out may not overlap. Temporary storage: all of ex->workspace. */
int32_t dev_exclusive_scan_i64(const moe_exec *ex, const int64_t *in, int64_t *out, int64_t n);

/* The primitives below take their temporary storage as a slice of ex->workspace that the caller
 * carves (temp, *temp_bytes), so that the caller's own arrays can live in the rest of it. Called with
 * temp == NULL they only store the bytes they need in *temp_bytes: a host computation that launches
 * nothing. Otherwise *temp_bytes is the slice's size (at least what the query said). */

/* Stable radix sort of n (key, value) pairs by bits [begin_bit, end_bit) of the key, ascending, or
 * descending (descending = 1; equal keys keep their input order either way). Double buffers:
 * keys[0] / vals[0] hold the input, keys[1] / vals[1] are scratch of n elements each; all four are
 * overwritten and *sel (0 or 1, known on return, before the work runs) says which pair holds the
 * sorted result. 0 <= n <= INT32_MAX, 0 <= begin_bit < end_bit <= 32; no buffer may overlap another. */
int32_t dev_sort_pairs_u32(const moe_exec *ex, void *temp, size_t *temp_bytes, uint32_t *const keys[2],
                           int32_t *const vals[2], int64_t n, int begin_bit, int end_bit, int descending, int *sel);

/* out[0] = 0, out[i + 1] = in[0] + ... + in[i] (int32) for i < n: out has n + 1 elements.
 * 1 <= n <= INT32_MAX, the total fits int32; in and out may not overlap. */
int32_t dev_exclusive_scan_i32(const moe_exec *ex, void *temp, size_t *temp_bytes, const int32_t *in, int32_t *out,
                               int64_t n);

} // namespace MOE_KNS

#endif

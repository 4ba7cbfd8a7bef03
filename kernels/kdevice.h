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
 * n >= 1. in and out may not overlap. */
int32_t dev_exclusive_scan_i64(const moe_exec *ex, const int64_t *in, int64_t *out, int64_t n);

} // namespace MOE_KNS

#endif

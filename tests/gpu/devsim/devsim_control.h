/*
 * Test-only controls of the device simulator (C linkage): what a test needs beyond the CUDA, cuBLASLt
 * and NCCL APIs the simulator stands in for. Nothing in libmoe calls these.
 *
 * Environment (read once, at the first runtime call):
 *   MOE_DEVSIM_DEVICES     simulated devices (default 2)
 *   MOE_DEVSIM_CC          compute capability, major*10+minor (default 90: Hopper)
 *   MOE_DEVSIM_MEM_MB      device memory per device in MiB (default 8192); beyond it allocations fail
 *                          with cudaErrorMemoryAllocation
 *   MOE_DEVSIM_SEED        seed of the per-stream random delays (default 1)
 *   MOE_DEVSIM_DELAY_US    largest random delay before a stream operation, microseconds (default 200;
 *                          0: none)
 *   MOE_DEVSIM_DEADLOCK_MS how long a simulated NCCL rank waits for its peers before the collective
 *                          is reported as a deadlock (default 20000)
 */
#ifndef MOE_DEVSIM_CONTROL_H
#define MOE_DEVSIM_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Makes the nth call (1-based, counted from now) at `site` fail with that site's documented error
 * ("alloc": cudaErrorMemoryAllocation, "launch": cudaErrorLaunchOutOfResources, "memcpy" and
 * "event" and "stream" and "graph": cudaErrorUnknown, "matmul": CUBLAS_STATUS_EXECUTION_FAILED,
 * "collective": ncclUnhandledCudaError, "comm_init": ncclSystemError). nth = 0 disarms the site.
 * Only one fault is armed at a time per site. */
void moe_devsim_fault_at(const char *site, int64_t nth);
/* Disarms every site and zeroes the call counters. */
void moe_devsim_fault_clear(void);
/* Calls counted at `site` since the last moe_devsim_fault_clear. */
int64_t moe_devsim_calls(const char *site);
/* 1 once an armed fault has fired (since the last moe_devsim_fault_clear). */
int32_t moe_devsim_fault_fired(void);

/* The message of the calling thread's last simulator error (why a call failed), "" if none. */
const char *moe_devsim_last_message(void);

/* Bytes of device memory live on device d, and live allocations (leak checks). */
size_t moe_devsim_live_bytes(int32_t device);
int64_t moe_devsim_live_allocations(int32_t device);

/* Holds (hold = 1) or releases (0) a stream: while held its worker starts no operation, so a test can
 * keep queued work pending deterministically (a host wait on a held stream blocks until it is
 * released by another thread). -1 for an invalid handle. */
int32_t moe_devsim_hold(void *stream, int32_t hold);

/* Lets a stream run n more operations, then holds it (n <= 0: holds it now); -1 for an invalid handle.
 * With moe_devsim_hold(stream, 0) to release: a test stops a stream in the middle of an entry point's
 * work to interleave another stream's work there deterministically. */
int32_t moe_devsim_hold_after(void *stream, int64_t n);
/* Operations queued on a stream and not yet run (-1 for an invalid handle). */
int64_t moe_devsim_pending(void *stream);

/* Sets the delay seed and largest delay (microseconds) for streams created from now on. */
void moe_devsim_set_delays(uint64_t seed, int32_t max_us);

#ifdef __cplusplus
}
#endif

#endif /* MOE_DEVSIM_CONTROL_H */

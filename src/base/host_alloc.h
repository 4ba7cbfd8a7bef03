/*
 * Host memory of the engine's own (handles, tables, host staging, and on the CPU backend the tensor
 * memory itself). Every host allocation of src/ goes through these, for two reasons:
 *   - fault injection: a test arms the seam to fail the n-th allocation from now, and so walks every
 *     allocation of a create / forward / backward to check that each failure returns an error status,
 *     leaks nothing and leaves the objects usable (tests/unit/test_fault_injection.c);
 *   - leak accounting without a sanitizer: moe_host_live() is the number of live allocations.
 * The seam is internal (hidden from libmoe.so by the version script); the unit tests link the static
 * library. Disarmed it costs one relaxed atomic load per allocation.
 * Not routed here: the CPU GEMM's per-thread scratch (src/backend/cpu/cpu_gemm.c), a cache owned by
 * each worker thread and freed at its exit, not by any engine object.
 */
#ifndef MOE_BASE_HOST_ALLOC_H
#define MOE_BASE_HOST_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *moe_host_malloc(size_t bytes);
void *moe_host_calloc(size_t count, size_t size);
void *moe_host_realloc(void *ptr, size_t bytes); /* ptr NULL: an allocation; bytes 0: refused (NULL) */
void *moe_host_aligned_alloc(size_t alignment, size_t bytes); /* bytes rounded up to alignment */
void moe_host_free(void *ptr);                               /* NULL is a no-op */

/* Test seam. n > 0: the n-th host allocation from now fails (returns NULL): only that one, or with
 * sticky every later one too (memory exhausted: retries fail as well); n = 0 disarms. Returns the
 * number of allocations attempted while armed since the last call. */
int64_t moe_fault_host_arm(int64_t n, int sticky);
/* Whether the armed failure has happened since moe_fault_host_arm. */
int moe_fault_host_fired(void);
/* Called where an injected failure happens (a breakpoint for debuggers). */
void moe_fault_host_fire(void);
/* Live host allocations of the engine (allocations minus frees). */
int64_t moe_host_live(void);

#endif /* MOE_BASE_HOST_ALLOC_H */

/* The host-allocation seam (host_alloc.h). Counters are atomics: OpenMP workers of the CPU backend
 * allocate scratch too. */
#include "base/host_alloc.h"

#include <stdatomic.h>
#include <stdlib.h>

static _Atomic int64_t g_fail_at;  /* > 0: the allocation whose ordinal reaches it fails */
static _Atomic int g_sticky;       /* and so does every later one (memory exhausted) */
static _Atomic int64_t g_attempts; /* allocations since arming */
static _Atomic int g_fired;
static _Atomic int64_t g_live;

/* Where an injected failure happens: a debugger's breakpoint ("break moe_fault_host_fire"). */
__attribute__((noinline)) void moe_fault_host_fire(void) { atomic_store(&g_fired, 1); }

/* Whether this allocation is the one to fail (the seam is armed rarely: tests only). */
static int inject(void)
{
    if (atomic_load_explicit(&g_fail_at, memory_order_relaxed) <= 0) return 0;
    int64_t k = atomic_fetch_add(&g_attempts, 1) + 1;
    int64_t want = atomic_load(&g_fail_at);
    if (k < want || (k > want && !atomic_load(&g_sticky))) return 0;
    moe_fault_host_fire();
    return 1;
}

static void *counted(void *p)
{
    if (p) atomic_fetch_add_explicit(&g_live, 1, memory_order_relaxed);
    return p;
}

void *moe_host_malloc(size_t bytes) { return inject() ? NULL : counted(malloc(bytes ? bytes : 1)); }

void *moe_host_calloc(size_t count, size_t size)
{
    return inject() ? NULL : counted(calloc(count ? count : 1, size ? size : 1));
}

void *moe_host_realloc(void *ptr, size_t bytes)
{
    if (bytes == 0 || inject()) return NULL;
    if (!ptr) return counted(malloc(bytes));
    return realloc(ptr, bytes); /* moves or fails; the count of live blocks is unchanged either way */
}

void *moe_host_aligned_alloc(size_t alignment, size_t bytes)
{
    if (inject()) return NULL;
    if (bytes == 0) bytes = alignment;
    if (bytes > SIZE_MAX - alignment) return NULL;
    return counted(aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment));
}

void moe_host_free(void *ptr)
{
    if (!ptr) return;
    atomic_fetch_sub_explicit(&g_live, 1, memory_order_relaxed);
    free(ptr);
}

int64_t moe_fault_host_arm(int64_t n, int sticky)
{
    atomic_store(&g_fail_at, 0);
    int64_t made = atomic_exchange(&g_attempts, 0);
    atomic_store(&g_fired, 0);
    atomic_store(&g_sticky, sticky != 0);
    atomic_store(&g_fail_at, n > 0 ? n : 0);
    return made;
}

int moe_fault_host_fired(void) { return atomic_load(&g_fired); }

int64_t moe_host_live(void) { return atomic_load(&g_live); }

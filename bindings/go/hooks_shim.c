/*
 * Hook tables whose entries are C trampolines into the exported Go functions of callbacks.go.
 * user_data carries a runtime/cgo.Handle (an integer, never a Go pointer); release deletes it.
 */
#include "_cgo_export.h"
#include "shim.h"

#define HANDLE(ud) ((uintptr_t)(ud))

static void t_release(void *ud) { gomoeRelease(HANDLE(ud)); }

static void t_log(void *ud, int32_t level, const char *msg) { gomoeLog(HANDLE(ud), level, (char *)msg); }

moe_logger *gomoe_logger_new(uintptr_t handle, int32_t max_level)
{
    moe_logger *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->struct_size = sizeof *l;
    l->max_level = max_level;
    l->user_data = (void *)handle;
    l->log = t_log;
    l->release = t_release;
    return l;
}

/* the stream crosses as an integer: Go's Stream is a uintptr, never a pointer */
static void *t_alloc(void *ud, size_t bytes, size_t alignment, int32_t dev_type, int32_t dev_id, void *stream)
{
    return gomoeAlloc(HANDLE(ud), bytes, alignment, dev_type, dev_id, (uintptr_t)stream);
}

static void t_free(void *ud, void *ptr, size_t bytes, int32_t dev_type, int32_t dev_id, void *stream)
{
    gomoeFree(HANDLE(ud), ptr, bytes, dev_type, dev_id, (uintptr_t)stream);
}

moe_allocator *gomoe_allocator_new(uintptr_t handle)
{
    moe_allocator *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->struct_size = sizeof *a;
    a->user_data = (void *)handle;
    a->alloc = t_alloc;
    a->free = t_free;
    a->release = t_release;
    return a;
}

static void t_push(void *ud, const char *name) { gomoeRangePush(HANDLE(ud), (char *)name); }
static void t_pop(void *ud) { gomoeRangePop(HANDLE(ud)); }

moe_profiler *gomoe_profiler_new(uintptr_t handle)
{
    moe_profiler *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->struct_size = sizeof *p;
    p->user_data = (void *)handle;
    p->range_push = t_push;
    p->range_pop = t_pop;
    p->release = t_release;
    return p;
}

static int32_t t_all_to_all_v(void *ud, const void *send, const int64_t *send_bytes, const int64_t *send_offsets,
                              void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets)
{
    return gomoeAllToAllV(HANDLE(ud), (void *)send, (int64_t *)send_bytes, (int64_t *)send_offsets, recv,
                          (int64_t *)recv_bytes, (int64_t *)recv_offsets);
}

static int32_t t_all_gather_v(void *ud, const void *send, int64_t send_bytes, void *recv, const int64_t *recv_bytes,
                              const int64_t *recv_offsets)
{
    return gomoeAllGatherV(HANDLE(ud), (void *)send, send_bytes, recv, (int64_t *)recv_bytes, (int64_t *)recv_offsets);
}

static int32_t t_all_reduce(void *ud, void *buf, int64_t count, int32_t dtype)
{
    return gomoeAllReduce(HANDLE(ud), buf, count, dtype);
}

static int32_t t_broadcast(void *ud, void *buf, int64_t bytes, int32_t root)
{
    return gomoeBroadcast(HANDLE(ud), buf, bytes, root);
}

static int32_t t_barrier(void *ud) { return gomoeBarrier(HANDLE(ud)); }

moe_comm_hooks *gomoe_comm_hooks_new(uintptr_t handle, int32_t rank, int32_t size, int32_t with_barrier)
{
    moe_comm_hooks *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->struct_size = sizeof *c;
    c->rank = rank;
    c->size = size;
    c->user_data = (void *)handle;
    c->all_to_all_v = t_all_to_all_v;
    c->all_gather_v = t_all_gather_v;
    c->all_reduce = t_all_reduce;
    c->broadcast = t_broadcast;
    c->barrier = with_barrier ? t_barrier : NULL;
    c->release = t_release;
    return c;
}

void *gomoe_aligned_alloc(size_t bytes, size_t alignment)
{
    /* aligned_alloc wants a size that is a multiple of the alignment */
    size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    return aligned_alloc(alignment, rounded ? rounded : alignment);
}

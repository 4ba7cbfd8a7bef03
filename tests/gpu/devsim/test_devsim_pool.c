/*
 * The context's caching pool (src/runtime/pool.c) on the device simulator: what it may do with the
 * stream handles a host passes, the alignment it asks of an allocator hook, and its out-of-memory
 * retry. Deterministic: pending work is held with moe_devsim_hold, never raced.
 *
 *  - foreign streams: a block freed on a host's stream X is given back to CUDA on a stream valid at
 *    that moment (never on X's recorded handle, which the host may have destroyed, or which may now
 *    name another stream, of another device); the context's destruction leaks nothing;
 *  - alignment: cuBLASLt needs a 256-byte aligned workspace, so a hook that returns exactly the
 *    alignment it is asked for must still run a layer whose GEMMs use cuBLASLt; a hook that breaks
 *    the contract is reported as such (MOE_ERR_CALLBACK, naming the hook), not by cuBLASLt;
 *  - out of memory: an allocation that fits only once the cache is trimmed succeeds, even when the
 *    cached blocks were freed on a stream whose frees do not run soon.
 * Leak checks count live allocations (moe_devsim_live_allocations): moe_devsim_live_bytes also counts
 * the blocks the simulator's stream-ordered pool keeps after their frees ran (as CUDA's pool does).
 * Prints one line per failed check and "N passed, M failed" last.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "moe.h"
#include "runtime/runtime.h"
#include "devsim_control.h"
#include "testutil.h"

static int passed, failed;
#define CHECK_MSG(cond, ...)                                                                                       \
    do {                                                                                                           \
        if (cond) passed++;                                                                                        \
        else {                                                                                                     \
            failed++;                                                                                              \
            printf("FAIL line %d: %s: ", __LINE__, #cond);                                                         \
            printf(__VA_ARGS__);                                                                                   \
            printf("\n");                                                                                          \
        }                                                                                                          \
    } while (0)
#define CHECK(cond) CHECK_MSG(cond, "(simulator: %s)", moe_devsim_last_message())

#define MIB ((size_t)1 << 20)

static const char *ctx_error(moe_context *ctx)
{
    static char buf[1024];
    buf[0] = 0;
    if (ctx) moe_context_last_error(ctx, buf, sizeof buf);
    else moe_last_error(buf, sizeof buf);
    return buf;
}

/* ---------------------------------------------------------------- a logger that keeps every message */
static char logged[8192];
static void log_keep(void *u, int32_t level, const char *m)
{
    (void)u, (void)level;
    size_t n = strlen(logged);
    snprintf(logged + n, sizeof logged - n, "%s\n", m);
}

static moe_context *cuda_ctx(const moe_allocator *a, int32_t *status)
{
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.device_type = MOE_DEVICE_CUDA;
    cc.allocator = a;
    moe_logger lg;
    memset(&lg, 0, sizeof lg);
    lg.struct_size = sizeof lg;
    lg.max_level = MOE_LOG_ERROR;
    lg.log = log_keep;
    cc.logger = &lg;
    logged[0] = 0;
    moe_context *ctx = NULL;
    int32_t st = moe_context_create(&cc, &ctx);
    if (status) *status = st;
    else CHECK_MSG(st == MOE_OK, "moe_context_create: %s", ctx_error(NULL));
    return st ? NULL : ctx;
}

static cudaStream_t host_stream(void)
{
    cudaStream_t s = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    return s;
}

static int64_t live(void) { return moe_devsim_live_allocations(0); }

/* ================================================================ 4: foreign stream handles */

/* A block freed on host stream X, X destroyed by the host, then the cache trimmed: the block must go
 * back to CUDA (not be freed on X's dead handle, the error swallowed and the memory leaked). */
static void foreign_stream_destroyed_before_trim(void)
{
    const int64_t base = live();
    moe_context *ctx = cuda_ctx(NULL, NULL);
    if (!ctx) return;
    cudaStream_t x = host_stream();
    moe_exec ex = moe_context_enter(ctx, x);
    void *p = moe_mem_alloc(ctx, 4 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK_MSG(p != NULL, "moe_mem_alloc on a host stream: %s", ctx_error(ctx));
    if (!p) return;
    CHECK(moe_mem_zero(ctx, &ex, p, 4 * MIB) == MOE_OK); /* work on X that uses the block */
    moe_mem_free(ctx, p, 4 * MIB, MOE_MEM_ACTIVATIONS);  /* cached: freed in X's order */
    CHECK(cudaStreamSynchronize(x) == cudaSuccess);
    CHECK(cudaStreamDestroy(x) == cudaSuccess); /* the host is done with X */
    (void)moe_context_enter(ctx, NULL);
    const int64_t before = live();
    moe_mem_trim(ctx);
    CHECK_MSG(live() == before - 1, "trim after the host destroyed the block's stream: live allocations %lld -> %lld "
              "(expected %lld; simulator: %s)", (long long)before, (long long)live(), (long long)(before - 1),
              moe_devsim_last_message());
    moe_context_destroy(ctx);
    CHECK_MSG(live() == base, "after moe_context_destroy: %lld live allocations, %lld before the context",
              (long long)live(), (long long)base);
}

/* X destroyed, and the host's next stream (on device 1) gets X's handle back (the driver reuses
 * handles): the pool must not treat the recorded handle as the block's stream any more. Freeing the
 * device-0 block on it fails (memory of device 0 on a stream of device 1) and leaks it. */
static void foreign_stream_handle_reused(void)
{
    const int64_t base = live();
    moe_context *ctx = cuda_ctx(NULL, NULL);
    if (!ctx) return;
    cudaStream_t x = host_stream();
    (void)moe_context_enter(ctx, x);
    void *p = moe_mem_alloc(ctx, 2 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK(p != NULL);
    moe_mem_free(ctx, p, 2 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK(cudaStreamSynchronize(x) == cudaSuccess);
    CHECK(cudaStreamDestroy(x) == cudaSuccess);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    cudaStream_t y = host_stream();
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK_MSG(y == x, "the simulator reuses a drained, destroyed stream's handle (x %p, y %p)", (void *)x, (void *)y);
    (void)moe_context_enter(ctx, NULL);
    const int64_t before = live();
    moe_mem_trim(ctx);
    CHECK_MSG(live() == before - 1, "trim with the block's old handle now naming a device-1 stream: live "
              "allocations %lld -> %lld (expected %lld; simulator: %s)", (long long)before, (long long)live(),
              (long long)(before - 1), moe_devsim_last_message());
    /* the same with the block still cached at context destruction */
    (void)moe_context_enter(ctx, y == x ? y : NULL);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaStreamDestroy(y) == cudaSuccess);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    cudaStream_t z = host_stream();
    (void)moe_context_enter(ctx, z);
    void *q = moe_mem_alloc(ctx, 2 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK(q != NULL);
    moe_mem_free(ctx, q, 2 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK(cudaStreamSynchronize(z) == cudaSuccess);
    CHECK(cudaStreamDestroy(z) == cudaSuccess);
    moe_context_destroy(ctx);
    CHECK_MSG(live() == base, "after moe_context_destroy: %lld live allocations, %lld before the context",
              (long long)live(), (long long)base);
}

/* Stream order on a host stream still lets a step reuse its own blocks at once (no new device memory
 * while the stream is busy), and the reuse is ordered after the work that used the block before. */
static void foreign_stream_reuse_ordered(void)
{
    moe_context *ctx = cuda_ctx(NULL, NULL);
    if (!ctx) return;
    cudaStream_t x = host_stream();
    moe_exec ex = moe_context_enter(ctx, x);
    unsigned char *p = moe_mem_alloc(ctx, MIB, MOE_MEM_ACTIVATIONS);
    CHECK(p != NULL);
    moe_devsim_hold(x, 1); /* X is busy: nothing queued on it runs yet */
    CHECK(ex.be->memset(&ex, p, 1, MIB) == MOE_OK);
    moe_mem_free(ctx, p, MIB, MOE_MEM_ACTIVATIONS);
    /* another stream must not take the block while X's memset is pending */
    (void)moe_context_enter(ctx, NULL);
    void *other = moe_mem_alloc(ctx, MIB, MOE_MEM_ACTIVATIONS);
    CHECK_MSG(other != NULL && other != (void *)p, "the context's stream got the block X still writes (%p)", other);
    /* X itself may: its next work runs after the memset */
    ex = moe_context_enter(ctx, x);
    const int64_t allocs = ctx->dev_allocs;
    unsigned char *q = moe_mem_alloc(ctx, MIB, MOE_MEM_ACTIVATIONS);
    CHECK_MSG(q == p && ctx->dev_allocs == allocs, "X's next allocation: %p (freed block %p), %lld new device "
              "allocations", (void *)q, (void *)p, (long long)(ctx->dev_allocs - allocs));
    if (q) CHECK(ex.be->memset(&ex, q, 2, MIB) == MOE_OK);
    unsigned char h[2] = {0, 0};
    if (q) CHECK(cudaMemcpyAsync(h, q + MIB - 2, 2, cudaMemcpyDeviceToHost, x) == cudaSuccess);
    moe_devsim_hold(x, 0);
    CHECK(cudaStreamSynchronize(x) == cudaSuccess);
    CHECK_MSG(h[0] == 2 && h[1] == 2, "X's own reuse: read %d %d, expected 2 2", h[0], h[1]);
    if (q) moe_mem_free(ctx, q, MIB, MOE_MEM_ACTIVATIONS);
    CHECK(cudaStreamSynchronize(x) == cudaSuccess);
    (void)moe_context_enter(ctx, NULL);
    moe_mem_free(ctx, other, MIB, MOE_MEM_ACTIVATIONS);
    CHECK(cudaStreamDestroy(x) == cudaSuccess);
    moe_context_destroy(ctx);
}

/* ---------------------------------------------------------------- a small layer */
enum { T = 32, H = 64, F = 48, E = 4, K = 2 };

static moe_layer *small_layer(moe_context *ctx, int expect_ok)
{
    moe_layer_config c;
    moe_layer_config_init(&c, sizeof c);
    c.hidden_size = H;
    c.ffn_hidden_size = F;
    c.num_experts = E;
    c.top_k = K;
    c.activation = MOE_ACT_SWIGLU;
    c.param_dtype = MOE_DTYPE_FP32;
    c.seed = 7;
    moe_layer *L = NULL;
    int32_t st = moe_layer_create(ctx, &c, &L);
    if (expect_ok) CHECK_MSG(st == MOE_OK, "moe_layer_create: %s", ctx_error(ctx));
    return st ? NULL : L;
}

/* One forward (a training step's tape) on stream; the status. */
static int32_t forward_on(moe_context *ctx, moe_layer *L, moe_step **step, cudaStream_t stream)
{
    float hx[T * H];
    tu_fill_uniform_f(hx, T * H, 3, -1, 1);
    void *x = NULL, *y = NULL;
    CHECK(cudaMalloc(&x, sizeof hx) == cudaSuccess);
    CHECK(cudaMalloc(&y, sizeof hx) == cudaSuccess);
    CHECK(cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess); /* the layer's stream does not wait for the legacy stream */
    tu_tensor tx, ty;
    int64_t shape[2] = {T, H};
    tu_tensor_make(&tx, x, kDLFloat, 32, 2, shape);
    tu_tensor_make(&ty, y, kDLFloat, 32, 2, shape);
    tx.t.device.device_type = ty.t.device.device_type = kDLCUDA;
    tx.t.device.device_id = ty.t.device.device_id = 0;
    moe_step_config sc;
    moe_step_config_init(&sc, sizeof sc);
    int32_t st = moe_step_create(L, &sc, step);
    if (!st) st = moe_layer_forward(L, *step, &tx.t, &ty.t, stream);
    if (!st) {
        float hy[T * H];
        CHECK(cudaDeviceSynchronize() == cudaSuccess); /* stream NULL: the context's own stream */
        CHECK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost) == cudaSuccess);
        int finite = 1;
        for (int i = 0; i < T * H; i++) finite &= hy[i] == hy[i];
        CHECK_MSG(finite, "forward's output has NaN (0xFF poison read?)");
    }
    cudaFree(x);
    cudaFree(y);
    return st;
}

/* The layer run on a host stream that the host destroys before the context: nothing leaks. */
static void layer_on_foreign_stream(void)
{
    const int64_t base = live();
    moe_context *ctx = cuda_ctx(NULL, NULL);
    if (!ctx) return;
    moe_layer *L = small_layer(ctx, 1);
    if (!L) return;
    cudaStream_t x = host_stream();
    moe_step *step = NULL;
    int32_t st = forward_on(ctx, L, &step, x);
    CHECK_MSG(st == MOE_OK, "forward on a host stream: %s", ctx_error(ctx));
    moe_step_destroy(step);
    CHECK(cudaStreamSynchronize(x) == cudaSuccess);
    CHECK(cudaStreamDestroy(x) == cudaSuccess);
    /* ctx->cur_stream still names X after the forward returned (entry points do not reset it yet: the
     * entry work, runtime/entry.c, does); the layer's destruction would free its parameters in the order of
     * X's dead handle. Not the pool's doing: reset it as an entry point's end will. */
    (void)moe_context_enter(ctx, NULL);
    moe_layer_destroy(L);
    moe_context_destroy(ctx);
    CHECK_MSG(live() == base, "layer run on a destroyed host stream, context destroyed: %lld live allocations, %lld "
              "before (simulator: %s)", (long long)live(), (long long)base, moe_devsim_last_message());
}

/* ================================================================ 5: alignment of a hook's blocks */
/* A hook over cudaMalloc that returns exactly the alignment it is asked for (its pointers are an odd
 * multiple of it), or, with `ignore`, always 64 past a 512-byte boundary. */
typedef struct edge_hook {
    int ignore_after;     /* calls after which alignment is ignored (-1: never; 0: always) */
    int calls, bad_arg, released;
    size_t min_alignment; /* smallest alignment asked for */
    int64_t live;
    struct { void *p, *base; } map[512];
} edge_hook;

static void *edge_alloc(void *u, size_t bytes, size_t alignment, int32_t dt, int32_t id, void *stream)
{
    (void)id, (void)stream;
    edge_hook *h = u;
    h->calls++;
    if (dt != MOE_DEVICE_CUDA || alignment < 64 || (alignment & (alignment - 1))) h->bad_arg++;
    if (!h->min_alignment || alignment < h->min_alignment) h->min_alignment = alignment;
    size_t a = h->ignore_after >= 0 && h->calls > h->ignore_after ? 64 : alignment;
    void *base = NULL;
    if (cudaMalloc(&base, bytes + 4 * (a > 256 ? a : 256)) != cudaSuccess) return NULL;
    uintptr_t p = ((uintptr_t)base + 2 * a - 1) / (2 * a) * (2 * a) + a; /* aligned to a, not to 2a */
    if (a == 64) p = ((uintptr_t)base + 511) / 512 * 512 + 64;
    for (size_t i = 0; i < sizeof h->map / sizeof h->map[0]; i++)
        if (!h->map[i].p) {
            h->map[i].p = (void *)p;
            h->map[i].base = base;
            h->live++;
            return (void *)p;
        }
    cudaFree(base);
    return NULL;
}

static void edge_free(void *u, void *p, size_t bytes, int32_t dt, int32_t id, void *stream)
{
    (void)bytes, (void)dt, (void)id;
    edge_hook *h = u;
    for (size_t i = 0; i < sizeof h->map / sizeof h->map[0]; i++)
        if (h->map[i].p == p) {
            cudaStreamSynchronize((cudaStream_t)stream); /* work queued on the stream may still use it */
            cudaFree(h->map[i].base);
            h->map[i].p = NULL;
            h->live--;
            return;
        }
    h->bad_arg++;
}

static void edge_release(void *u) { ((edge_hook *)u)->released++; }

static moe_allocator edge_allocator(edge_hook *h)
{
    moe_allocator a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.user_data = h;
    a.alloc = edge_alloc;
    a.free = edge_free;
    a.release = edge_release;
    return a;
}

/* A hook that gives exactly the alignment it is asked for: the layer's cuBLASLt GEMMs must run. */
static void hook_exact_alignment(void)
{
    static edge_hook h;
    memset(&h, 0, sizeof h);
    h.ignore_after = -1;
    moe_allocator a = edge_allocator(&h);
    moe_context *ctx = cuda_ctx(&a, NULL);
    if (!ctx) return;
    CHECK_MSG(h.min_alignment >= 256, "the hook was asked for %zu-byte alignment; cuBLASLt's workspace needs 256",
              h.min_alignment);
    CHECK_MSG(((uintptr_t)ctx->workspace & 255) == 0, "workspace %p is not 256-byte aligned", ctx->workspace);
    moe_layer *L = small_layer(ctx, 1);
    if (L) {
        moe_step *step = NULL;
        int32_t st = forward_on(ctx, L, &step, NULL);
        CHECK_MSG(st == MOE_OK, "forward over a hook that honours the alignment argument exactly: %s (%s; simulator: %s)",
                  moe_status_name(st), ctx_error(ctx), moe_devsim_last_message());
        moe_step_destroy(step);
        moe_layer_destroy(L);
    }
    moe_context_destroy(ctx);
    CHECK_MSG(h.bad_arg == 0 && h.live == 0 && h.released == 1, "hook: %d bad arguments, %lld blocks live, released "
              "%d times", h.bad_arg, (long long)h.live, h.released);
}

/* A hook that ignores the alignment: reported as the hook's fault (MOE_ERR_CALLBACK naming the hook and
 * the alignment), at context creation (the workspace is its first block) or at the first misaligned
 * block later; the misaligned block goes back to the hook. */
static void hook_ignores_alignment(void)
{
    static edge_hook h;
    memset(&h, 0, sizeof h);
    h.ignore_after = 0;
    moe_allocator a = edge_allocator(&h);
    int32_t st = MOE_OK;
    moe_context *ctx = cuda_ctx(&a, &st);
    CHECK_MSG(st != MOE_OK, "moe_context_create accepted a hook whose workspace block %p is 64-byte aligned",
              ctx ? ctx->workspace : NULL);
    CHECK_MSG(strstr(logged, "moe_allocator.alloc") && strstr(logged, "256"), "messages logged: \"%s\"", logged);
    CHECK_MSG(h.live == 0 && h.released == 0, "hook: %lld blocks live, released %d times (a failed create releases "
              "nothing)", (long long)h.live, h.released);
    moe_context_destroy(ctx);

    memset(&h, 0, sizeof h);
    h.ignore_after = 1; /* the workspace is aligned, later blocks are not */
    a = edge_allocator(&h);
    ctx = cuda_ctx(&a, NULL);
    if (!ctx) return;
    moe_layer *L = small_layer(ctx, 0);
    if (L) {
        CHECK_MSG(0, "moe_layer_create over misaligned blocks succeeded");
        moe_layer_destroy(L);
    } else {
        char msg[1024];
        moe_context_last_error(ctx, msg, sizeof msg);
        CHECK_MSG(strstr(logged, "MOE_ERR_CALLBACK") && strstr(logged, "moe_allocator.alloc") && !strstr(msg, "cuBLAS"),
                  "layer over a hook that ignores the alignment: last error \"%s\", logged \"%s\"", msg, logged);
    }
    moe_context_destroy(ctx);
    CHECK_MSG(h.live == 0 && h.released == 1, "hook: %lld blocks live, released %d times", (long long)h.live,
              h.released);
}

/* ================================================================ 7: out of memory after a trim */
/* MOE_DEVSIM_MEM_MB=128 (set in main): the 32 MiB workspace, then 8 cached 8 MiB blocks freed on a host
 * stream whose queue is busy (held), then 48 MiB on the context's stream: fits only once the cache is
 * given back. */
static void oom_retry_after_trim(void)
{
    moe_context *ctx = cuda_ctx(NULL, NULL);
    if (!ctx) return;
    cudaStream_t x = host_stream();
    (void)moe_context_enter(ctx, x);
    void *blocks[8];
    int n = 0;
    for (int i = 0; i < 8; i++) {
        blocks[i] = moe_mem_alloc(ctx, 8 * MIB, MOE_MEM_ACTIVATIONS);
        CHECK_MSG(blocks[i] != NULL, "block %d: %s", i, ctx_error(ctx));
        if (blocks[i]) n++;
    }
    for (int i = 0; i < 8; i++) moe_mem_free(ctx, blocks[i], 8 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK(ctx->pool_bytes == (size_t)n * 8 * MIB);
    CHECK(cudaStreamSynchronize(x) == cudaSuccess);
    moe_devsim_hold(x, 1); /* X is busy with the host's other work */
    (void)moe_context_enter(ctx, NULL);
    const int64_t trims = ctx->trims;
    void *big = moe_mem_alloc(ctx, 48 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK_MSG(big != NULL, "48 MiB after trimming 64 MiB of cached blocks (128 MiB device, 32 MiB workspace): %s",
              ctx_error(ctx));
    CHECK_MSG(ctx->trims == trims + 1 && ctx->pool_count == 0, "trims %lld -> %lld, %d blocks cached",
              (long long)trims, (long long)ctx->trims, ctx->pool_count);
    if (big) moe_mem_free(ctx, big, 48 * MIB, MOE_MEM_ACTIVATIONS);
    moe_devsim_hold(x, 0);
    CHECK(cudaStreamSynchronize(x) == cudaSuccess);
    CHECK(cudaStreamDestroy(x) == cudaSuccess);
    moe_context_destroy(ctx);
}

/* The same with the blocks cached from the copy stream's deferred frees (moe_mem_free_after) and the
 * allocation on a host stream. */
static void oom_retry_after_trim_copy_stream(void)
{
    moe_context *ctx = cuda_ctx(NULL, NULL);
    if (!ctx) return;
    moe_exec cx;
    CHECK(moe_context_copy_exec(ctx, &cx) == MOE_OK);
    (void)moe_context_enter(ctx, NULL);
    void *blocks[8];
    for (int i = 0; i < 8; i++) blocks[i] = moe_mem_alloc(ctx, 8 * MIB, MOE_MEM_ACTIVATIONS);
    for (int i = 0; i < 8; i++) {
        void *ev = NULL;
        CHECK(cx.be->event_create(&cx, &ev) == MOE_OK);
        CHECK(cx.be->event_record(&cx, ev) == MOE_OK);
        if (blocks[i]) moe_mem_free_after(ctx, blocks[i], 8 * MIB, MOE_MEM_ACTIVATIONS, ev);
    }
    CHECK(cudaStreamSynchronize((cudaStream_t)ctx->copy_stream) == cudaSuccess);
    moe_mem_reap(ctx, 0); /* into the cache */
    CHECK(ctx->pool_bytes == 64 * MIB);
    moe_devsim_hold(ctx->stream, 1); /* the context's stream is busy */
    cudaStream_t x = host_stream();
    (void)moe_context_enter(ctx, x);
    void *big = moe_mem_alloc(ctx, 48 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK_MSG(big != NULL, "48 MiB on a host stream after trimming 64 MiB of cached blocks: %s", ctx_error(ctx));
    if (big) moe_mem_free(ctx, big, 48 * MIB, MOE_MEM_ACTIVATIONS);
    CHECK(cudaStreamSynchronize(x) == cudaSuccess);
    moe_devsim_hold(ctx->stream, 0);
    (void)moe_context_enter(ctx, NULL);
    CHECK(cudaStreamDestroy(x) == cudaSuccess);
    moe_context_destroy(ctx);
}

int main(void)
{
    setenv("MOE_DEVSIM_MEM_MB", "128", 1); /* before the first runtime call */
    oom_retry_after_trim();
    oom_retry_after_trim_copy_stream();
    foreign_stream_destroyed_before_trim();
    foreign_stream_handle_reused();
    foreign_stream_reuse_ordered();
    layer_on_foreign_stream();
    hook_exact_alignment();
    hook_ignores_alignment();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/*
 * CUDA Graphs for static-shape layer calls (graph.h).
 *
 * What is captured: everything a call queues on its stream after the host-side checks: the ops of
 * the call's body and the backend copies and fills it makes. What is not: the host code itself
 * (argument checks, the NaN/Inf rejection read-back, profiler ranges, which fire at capture only).
 * A replay therefore restores what the body leaves on the host: the step's scalar state (T, R, Rx,
 * capacity, state) and the contents of its host buffers (e.g. the expert row offsets).
 *
 * When: the backend has graphs, the layer's config allows them (cfg.graphs), the shapes are static
 * (capacity with pad_to_capacity) on one rank without communicators or chunking, and nothing is
 * offloaded (offload frees and reallocates tape buffers and works on a second stream every step). A call's key is its
 * phase, T, mode and loss scale, the stream, the data pointers in and out, and every tape buffer
 * (pointer and size): a host that reuses its steps and tensors replays; a changed key captures anew
 * (up to MOE_GRAPH_SLOTS graphs per phase, least recently used evicted).
 * Warm-up: the first call of a phase with a key runs eagerly, and only the second call with that
 * key captures. With lazy loading (CUDA_MODULE_LOADING=LAZY, the default on Linux since CUDA 12.2;
 * CUDA C++ Programming Guide, "Lazy Loading") a kernel's module is loaded at its first launch, which
 * drivers before 12.3 cannot do inside a stream capture, and cuBLASLt's and CUB's first use of a plan
 * or algorithm may initialise or allocate; the documented practice is to run the work once before
 * capturing it. Each phase remembers the keys it ran eagerly (MOE_GRAPH_WARM_KEYS, oldest forgotten
 * first): the key the call came with, and the key after the body (a body that places tape buffers,
 * as the first backward of a step does, has then run eagerly on exactly those buffers, so the next
 * call, which brings them, captures).
 * The capture must not allocate or free pool memory (a graph cannot own it): forward reserves its
 * tape before the capture; a body that still allocates abandons the capture and runs eagerly, and
 * the next call with the buffers in place captures. After MOE_GRAPH_MAX_FAILURES abandoned captures
 * a phase stays eager.
 */
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "comm/comm.h"
#include "core/graph.h"

#define MOE_GRAPH_SLOTS 4
#define MOE_GRAPH_MAX_FAILURES 8
#define MOE_GRAPH_WARM_KEYS (2 * MOE_GRAPH_SLOTS)
#define KEY_WORDS 10

typedef struct graph_entry {
    int used;
    uint64_t key[KEY_WORDS];
    void *graph;
    uint64_t last_use;
    /* what the body leaves on the host */
    int32_t state;
    int64_t T, R, B, capacity, Rx;
    int32_t have_plan;
    unsigned char *host_bytes; /* the tape's host buffers, back to back */
    size_t host_len;
} graph_entry;

struct moe_graph_cache {
    graph_entry e[MOE_GRAPH_PHASES][MOE_GRAPH_SLOTS];
    int32_t failures[MOE_GRAPH_PHASES];
    uint64_t clock;
    /* the keys each phase has run eagerly (warm-up), a ring */
    uint64_t warm[MOE_GRAPH_PHASES][MOE_GRAPH_WARM_KEYS][KEY_WORDS];
    int32_t warm_count[MOE_GRAPH_PHASES], warm_next[MOE_GRAPH_PHASES];
};

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

static void make_key(const moe_step *s, int32_t phase, const moe_exec *e, const void *in, const void *out,
                     uint64_t key[KEY_WORDS])
{
    uint64_t scale;
    memcpy(&scale, &s->aux_loss_scale, sizeof scale);
    uint64_t tape = 0;
    const moe_buf *b = (const moe_buf *)&s->tape;
    for (size_t i = 0; i < sizeof s->tape / sizeof(moe_buf); i++)
        tape = mix(mix(tape, (uint64_t)(uintptr_t)b[i].p), (uint64_t)b[i].bytes);
    uint64_t params = 0;
    for (int i = 0; i < MOE_PARAM_NUM_SLOTS; i++)
        params = mix(mix(params, (uint64_t)(uintptr_t)s->layer->param[i].p), (uint64_t)(uintptr_t)s->layer->grad[i].p);
    uint64_t k[KEY_WORDS] = {(uint64_t)phase, (uint64_t)s->T, (uint64_t)s->mode, scale, (uint64_t)(uintptr_t)e->stream,
                             (uint64_t)(uintptr_t)in, (uint64_t)(uintptr_t)out, tape, params,
                             (uint64_t)s->layer->grad_mode};
    memcpy(key, k, sizeof k);
}

static int warm_has(const struct moe_graph_cache *gc, int32_t phase, const uint64_t key[KEY_WORDS])
{
    for (int i = 0; i < gc->warm_count[phase]; i++)
        if (memcmp(gc->warm[phase][i], key, sizeof gc->warm[phase][i]) == 0) return 1;
    return 0;
}

static void warm_add(struct moe_graph_cache *gc, int32_t phase, const uint64_t key[KEY_WORDS])
{
    if (warm_has(gc, phase, key)) return;
    memcpy(gc->warm[phase][gc->warm_next[phase]], key, sizeof gc->warm[phase][0]);
    gc->warm_next[phase] = (gc->warm_next[phase] + 1) % MOE_GRAPH_WARM_KEYS;
    if (gc->warm_count[phase] < MOE_GRAPH_WARM_KEYS) gc->warm_count[phase]++;
}

static void entry_clear(const moe_backend *be, graph_entry *g)
{
    if (g->used && g->graph) be->graph_destroy(g->graph);
    moe_host_free(g->host_bytes);
    memset(g, 0, sizeof *g);
}

void moe_graph_cache_free(moe_layer *L)
{
    if (!L->graphs) return;
    for (int p = 0; p < MOE_GRAPH_PHASES; p++)
        for (int i = 0; i < MOE_GRAPH_SLOTS; i++) entry_clear(L->ctx->backend, &L->graphs->e[p][i]);
    moe_host_free(L->graphs);
    L->graphs = NULL;
}

/* The step's host buffers, back to back (to == NULL: their total size). */
static size_t host_buffers(moe_step *s, unsigned char *to, int restore)
{
    size_t n = 0;
    moe_buf *b = (moe_buf *)&s->tape;
    for (size_t i = 0; i < sizeof s->tape / sizeof(moe_buf); i++) {
        if (!b[i].host || !b[i].p) continue;
        if (to && restore) memcpy(b[i].p, to + n, b[i].bytes);
        else if (to) memcpy(to + n, b[i].p, b[i].bytes);
        n += b[i].bytes;
    }
    return n;
}

static int32_t replay(moe_layer *L, moe_step *s, graph_entry *g, const moe_exec *e)
{
    int32_t st = L->ctx->backend->graph_launch(e, g->graph);
    if (st) return moe_errorf(L->ctx, st, "replaying a captured graph failed");
    s->state = g->state;
    s->T = g->T, s->R = g->R, s->B = g->B, s->capacity = g->capacity, s->Rx = g->Rx;
    s->host.have_plan = g->have_plan;
    host_buffers(s, g->host_bytes, 1);
    s->stream = e->stream;
    s->reserved = 0;
    L->ctx->graph_replays++;
    g->last_use = ++L->graphs->clock;
    return MOE_OK;
}

int32_t moe_graph_run(moe_layer *L, moe_step *step, int32_t phase, const moe_exec *e, const void *in, const void *out,
                      moe_graph_body body, void *arg)
{
    if (!moe_graph_eligible(L)) return body(L, step, e, arg);
    moe_context *ctx = L->ctx;
    const moe_backend *be = ctx->backend;
    if (!L->graphs) {
        L->graphs = moe_host_calloc(1, sizeof *L->graphs);
        if (!L->graphs) return body(L, step, e, arg); /* no memory for the cache: stay eager */
    }
    struct moe_graph_cache *gc = L->graphs;
    uint64_t key[KEY_WORDS];
    make_key(step, phase, e, in, out, key);
    graph_entry *slot = &gc->e[phase][0];
    for (int i = 0; i < MOE_GRAPH_SLOTS; i++) {
        graph_entry *g = &gc->e[phase][i];
        if (g->used && memcmp(g->key, key, sizeof key) == 0) return replay(L, step, g, e);
        if (!g->used || (slot->used && g->last_use < slot->last_use)) slot = g;
    }
    if (gc->failures[phase] >= MOE_GRAPH_MAX_FAILURES) return body(L, step, e, arg);
    if (!warm_has(gc, phase, key)) { /* warm-up: the first call with this key runs eagerly */
        int32_t st = body(L, step, e, arg);
        if (st == MOE_OK) {
            uint64_t after[KEY_WORDS];
            make_key(step, phase, e, in, out, after);
            warm_add(gc, phase, key);
            warm_add(gc, phase, after);
        }
        return st;
    }

    /* capture: the body's work is recorded, not run */
    if (be->graph_begin(e) != MOE_OK) {
        gc->failures[phase]++;
        return body(L, step, e, arg);
    }
    ctx->capturing = 1;
    ctx->capture_broken = 0;
    int32_t st = body(L, step, e, arg);
    void *graph = NULL;
    int32_t st_end = be->graph_end(e, &graph);
    ctx->capturing = 0;
    int broken = ctx->capture_broken || st || st_end || !graph;
    moe_mem_flush_deferred(ctx); /* what the abandoned body freed was used by unrun work only */
    if (broken) {
        if (graph) be->graph_destroy(graph);
        gc->failures[phase]++;
        ctx->graph_fallbacks++;
        moe_logf(ctx, MOE_LOG_DEBUG, "graph capture of phase %d abandoned (%s); running eagerly", phase,
                 ctx->capture_broken ? "the call allocates or frees memory" : "capture failed");
        return body(L, step, e, arg);
    }
    entry_clear(be, slot);
    slot->used = 1;
    memcpy(slot->key, key, sizeof key);
    slot->graph = graph;
    slot->state = step->state;
    slot->T = step->T, slot->R = step->R, slot->B = step->B, slot->capacity = step->capacity, slot->Rx = step->Rx;
    slot->have_plan = step->host.have_plan;
    slot->host_len = host_buffers(step, NULL, 0);
    if (slot->host_len) {
        slot->host_bytes = moe_host_malloc(slot->host_len);
        if (!slot->host_bytes) {
            entry_clear(be, slot);
            return body(L, step, e, arg);
        }
        host_buffers(step, slot->host_bytes, 0);
    }
    ctx->graph_captures++;
    /* the captured work has not run yet: run it now */
    st = be->graph_launch(e, graph);
    if (st) return moe_errorf(ctx, st, "launching a freshly captured graph failed");
    ctx->graph_replays++;
    slot->last_use = ++gc->clock;
    return MOE_OK;
}

/* ---------------------------------------------------------------- the layer calls */
typedef struct fwd_args {
    int64_t T;
    const void *x;
    void *y;
} fwd_args;

static int32_t fwd_body(moe_layer *L, moe_step *s, const moe_exec *e, void *arg)
{
    fwd_args *a = arg;
    return moe_layer_forward_impl(L, s, a->T, a->x, a->y, e);
}

int32_t moe_layer_forward_run(moe_layer *L, moe_step *step, int64_t T, const void *x, void *y, const moe_exec *e)
{
    fwd_args a = {T, x, y};
    TRY(moe_offload_settle(step, e)); /* a reload queued by moe_step_prefetch lands before the tape is rewritten */
    if (moe_graph_eligible(L)) { /* the tape in place before the key is taken and before any capture */
        step->T = T;
        TRY(moe_layer_reserve_forward(L, step, T, e));
    }
    return moe_graph_run(L, step, MOE_GRAPH_FORWARD, e, x, y, fwd_body, &a);
}

typedef struct bwd_args {
    const void *dy;
    void *dx;
} bwd_args;

static int32_t bwd_data_body(moe_layer *L, moe_step *s, const moe_exec *e, void *arg)
{
    bwd_args *a = arg;
    return moe_layer_backward_data_impl(L, s, a->dy, a->dx, e);
}

static int32_t bwd_weights_body(moe_layer *L, moe_step *s, const moe_exec *e, void *arg)
{
    (void)arg;
    return moe_layer_backward_weights_impl(L, s, e);
}

int32_t moe_layer_backward_data_run(moe_layer *L, moe_step *step, const void *dy, void *dx, const moe_exec *e)
{
    bwd_args a = {dy, dx};
    return moe_graph_run(L, step, MOE_GRAPH_BACKWARD_DATA, e, dy, dx, bwd_data_body, &a);
}

int32_t moe_layer_backward_weights_run(moe_layer *L, moe_step *step, const moe_exec *e)
{
    return moe_graph_run(L, step, MOE_GRAPH_BACKWARD_WEIGHTS, e, NULL, NULL, bwd_weights_body, NULL);
}

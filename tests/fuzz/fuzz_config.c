/*
 * fuzz_config: every config struct of the ABI from fuzzer bytes, then create and destroy.
 *
 * The first byte picks the struct: context (with allocator, logger and profiler tables), layer,
 * step, dispatcher, comm (self, hooks, MPI, NCCL), parallel (layers over comms), layout, planner
 * model + parallel (presets and estimate), output structs (memory stats, routing stats, gradient report,
 * get_config), and the *_init functions. Each struct's header is the host's: struct_size (older,
 * newer, tiny; the host's buffer is exactly that long, so ASan sees any read beyond it),
 * api_version, and `next`, which may be a garbage pointer that the engine must refuse without
 * dereferencing. The body is either typical values with odd ones mixed in, or raw input bytes.
 * Pointer fields other than `next` (hook tables, comms, the layout's order string) always point at
 * real objects or are NULL: the ABI dereferences them by contract.
 *
 * Checks beyond "no crash": documented refusals (struct_size below the first release, api_version 0
 * or of another major, a non-NULL next, bytes beyond the engine's struct that are not zero) fail;
 * a failed create writes no handle; hook tables are released exactly once, and only when adopted;
 * profiler ranges balance; every failure's message begins with its status name.
 */
#include "fuzz_common.h"

/* ---------------------------------------------------------------- host struct headers */
typedef struct host {
    void *buf;       /* struct_size bytes (at least the struct_size field) */
    uint32_t size;   /* struct_size as written */
    uint32_t version;
    int next_set;    /* next is a non-NULL garbage pointer */
    int tail_set;    /* a byte beyond our struct is non-zero */
} host;

/* Writes the header into `full` (a struct of `ours` bytes whose body is filled) and copies it into
 * a buffer of the host's struct_size. */
static void host_make(fz *f, void *full, size_t ours, host *h)
{
    memset(h, 0, sizeof *h);
    uint8_t mode = fz_u8(f);
    uint32_t sz = (uint32_t)ours, ver = MOE_API_VERSION;
    uint64_t next = 0;
    if (mode >= 160) {
        if (mode & 1) sz = (uint32_t)fz_range(f, 0, (int64_t)ours + 64);
        if (mode & 2) sz = (uint32_t)fz_range(f, 0, 4096);
        if (mode & 4) {
            static const uint32_t vers[] = {0, 1, 100, 200, 9999, 10000, 10200, 20000, MOE_API_VERSION + 1, UINT32_MAX};
            ver = (fz_u8(f) & 1) ? fz_u32(f) : vers[fz_u8(f) % (sizeof vers / sizeof vers[0])];
        }
        if (mode & 8) {
            next = fz_u64(f);
            if (next == 0) next = 0xdeadbeefull; /* never dereferenceable: unmapped low memory */
        }
    }
    memcpy(full, &sz, 4);
    memcpy((char *)full + 4, &ver, 4);
    const void *np = (const void *)(uintptr_t)next;
    memcpy((char *)full + 8, &np, sizeof np);
    size_t bytes = sz < 4 ? 4 : sz;
    h->buf = malloc(bytes);
    memcpy(h->buf, full, bytes < ours ? bytes : ours);
    if (bytes > ours) {
        memset((char *)h->buf + ours, 0, bytes - ours);
        if (mode & 16) {
            size_t at = (size_t)fz_range(f, 0, (int64_t)(bytes - ours - 1));
            ((unsigned char *)h->buf)[ours + at] = fz_u8(f);
            h->tail_set = ((unsigned char *)h->buf)[ours + at] != 0;
        }
    }
    h->size = sz;
    h->version = ver;
    h->next_set = next != 0;
}

/* Body from raw input bytes (after the header), or left as the structured filler wrote it. */
static int raw_body(fz *f, void *full, size_t ours)
{
    if (fz_u8(f) < 224) return 0;
    fz_bytes(f, (char *)full + 16, ours - 16);
    return 1;
}

/* What the ABI promises about a header whatever the body: the call fails, with MOE_ERR_VERSION for
 * a struct_size below any release when this is the call's only config (exact). */
static void check_header_of(const host *h, int32_t st, const char *call, int exact)
{
    if (h->size < 16) {
        if (exact) FZ_CHECK(st == MOE_ERR_VERSION, "%s: struct_size %u: status %d", call, h->size, st);
        else FZ_CHECK(st != MOE_OK, "%s: struct_size %u accepted", call, h->size);
    }
    if (h->size >= 16) {
        if (h->version == 0 || h->version / 10000 != MOE_VERSION_MAJOR)
            FZ_CHECK(st != MOE_OK, "%s: api_version %u accepted", call, h->version);
        if (h->next_set) FZ_CHECK(st != MOE_OK, "%s: a non-NULL next accepted", call);
        if (h->tail_set) FZ_CHECK(st != MOE_OK, "%s: a non-zero byte beyond the engine's struct accepted", call);
    }
}
static void check_header(const host *h, int32_t st, const char *call) { check_header_of(h, st, call, 1); }

/* ---------------------------------------------------------------- hook tables */
typedef struct logger_state {
    int64_t messages;
    int32_t released;
} logger_state;

static void log_fn(void *ud, int32_t level, const char *message)
{
    logger_state *s = ud;
    FZ_CHECK(!s->released, "logger called after release");
    FZ_CHECK(level >= MOE_LOG_ERROR && level <= MOE_LOG_DEBUG, "logger level %d", level);
    FZ_CHECK(message && strlen(message) < 4096, "logger message");
    s->messages++;
}
static void log_release(void *ud)
{
    logger_state *s = ud;
    FZ_CHECK(!s->released, "logger released twice");
    s->released = 1;
}

typedef struct prof_state {
    int32_t depth, released;
    int64_t pushes;
} prof_state;

static void prof_push(void *ud, const char *name)
{
    prof_state *s = ud;
    FZ_CHECK(!s->released, "profiler called after release");
    FZ_CHECK(name && strlen(name) < 256, "range name");
    s->depth++;
    s->pushes++;
}
static void prof_pop(void *ud)
{
    prof_state *s = ud;
    FZ_CHECK(s->depth > 0, "range_pop without a matching push");
    s->depth--;
}
static void prof_release(void *ud)
{
    prof_state *s = ud;
    FZ_CHECK(!s->released, "profiler released twice");
    FZ_CHECK(s->depth == 0, "profiler released with %d ranges open", s->depth);
    s->released = 1;
}

/* A comm hook table that behaves as `size` ranks that all sent what this one sent. */
typedef struct hooks_state {
    int32_t rank, size, released;
} hooks_state;

static int32_t h_a2a(void *ud, const void *send, const int64_t *sb, const int64_t *so, void *recv, const int64_t *rb,
                     const int64_t *ro)
{
    hooks_state *s = ud;
    for (int32_t p = 0; p < s->size; p++) {
        int64_t n = rb[p] < sb[p] ? rb[p] : sb[p];
        if (n > 0) memcpy((char *)recv + ro[p], (const char *)send + so[p], (size_t)n);
    }
    return 0;
}
static int32_t h_ag(void *ud, const void *send, int64_t sb, void *recv, const int64_t *rb, const int64_t *ro)
{
    hooks_state *s = ud;
    for (int32_t p = 0; p < s->size; p++) {
        int64_t n = rb[p] < sb ? rb[p] : sb;
        if (n > 0) memcpy((char *)recv + ro[p], send, (size_t)n);
    }
    return 0;
}
static int32_t h_ar(void *ud, void *buf, int64_t count, int32_t dtype)
{
    (void)ud, (void)buf, (void)count, (void)dtype;
    return 0;
}
static int32_t h_bc(void *ud, void *buf, int64_t bytes, int32_t root)
{
    (void)ud, (void)buf, (void)bytes, (void)root;
    return 0;
}
static int32_t h_barrier(void *ud)
{
    (void)ud;
    return 0;
}
static void h_release(void *ud)
{
    hooks_state *s = ud;
    FZ_CHECK(!s->released, "comm hooks released twice");
    s->released = 1;
}

static moe_comm_hooks hooks_table(hooks_state *s, int32_t rank, int32_t size)
{
    s->rank = rank, s->size = size, s->released = 0;
    moe_comm_hooks h = {sizeof h, rank, size, 0, s, h_a2a, h_ag, h_ar, h_bc, h_barrier, h_release};
    return h;
}

/* ---------------------------------------------------------------- context */
static void run_context(fz *f)
{
    moe_context_config full;
    memset(&full, 0, sizeof full);
    if (!raw_body(f, &full, sizeof full)) {
        static const int32_t types[] = {0, MOE_DEVICE_CPU, MOE_DEVICE_CUDA, 3, -1, INT32_MAX};
        full.device_type = types[fz_u8(f) % 6];
        full.device_id = fz_u8(f) >= 224 ? (int32_t)fz_odd(f) : 0;
        full.num_threads = fz_dim32(f, 1, 3);
        full.reserved0 = fz_u8(f) >= 248 ? (int32_t)fz_u32(f) : 0;
    }
    /* hook tables: absent, complete, or with odd sizes and missing entries */
    fz_alloc as;
    memset(&as, 0, sizeof as);
    as.limit = (size_t)4 << 20;
    logger_state ls = {0, 0};
    prof_state ps = {0, 0, 0};
    moe_allocator al = {sizeof al, 0, &as, fz_alloc_fn, fz_free_fn, fz_release_fn};
    moe_logger lg = {sizeof lg, MOE_LOG_DEBUG, &ls, log_fn, log_release};
    moe_profiler pr = {sizeof pr, 0, &ps, prof_push, prof_pop, prof_release};
    uint8_t which = fz_u8(f);
    full.allocator = (which & 3) ? &al : NULL;
    full.logger = (which & 12) ? &lg : NULL;
    full.profiler = (which & 48) ? &pr : NULL;
    if (which & 64) { /* odd tables */
        al.struct_size = (uint32_t)fz_range(f, 0, sizeof al + 8);
        lg.struct_size = (uint32_t)fz_range(f, 0, sizeof lg + 8);
        pr.struct_size = (uint32_t)fz_range(f, 0, sizeof pr + 8);
        uint8_t missing = fz_u8(f);
        if (missing & 1) al.alloc = NULL;
        if (missing & 2) al.free = NULL;
        if (missing & 4) al.release = NULL;
        if (missing & 8) lg.log = NULL;
        if (missing & 16) lg.release = NULL;
        if (missing & 32) pr.range_push = NULL;
        if (missing & 64) pr.range_pop = NULL;
        if (missing & 128) pr.release = NULL;
        lg.max_level = (int32_t)fz_odd(f);
        al.reserved = fz_u8(f) >= 240 ? fz_u32(f) : 0;
    }
    /* a profiler with only one of push / pop cannot balance; the ABI allows NULL entries, so give
     * both or neither to keep the balance check meaningful */
    if (!pr.range_push || !pr.range_pop) pr.range_push = NULL, pr.range_pop = NULL;
    host h;
    host_make(f, &full, sizeof full, &h);
    moe_context *sentinel = (moe_context *)(uintptr_t)0x10, *ctx = sentinel;
    int32_t st = moe_context_create(h.buf, &ctx);
    check_header(&h, st, "moe_context_create");
    fz_check_message(NULL, st, "moe_context_create");
    if (st != MOE_OK) {
        FZ_CHECK(ctx == sentinel, "moe_context_create failed but wrote *out");
        FZ_CHECK(!as.released && !ls.released && !ps.released, "a failed moe_context_create released a hook table");
        free(h.buf);
        return;
    }
    free(h.buf); /* the engine copied everything */
    /* use it: a small layer, a forward (profiler ranges), a refused call (logger) */
    moe_layer_config lc;
    moe_layer_config_init(&lc, sizeof lc);
    fz_layer_fields(f, &lc, 0);
    moe_layer *layer = NULL;
    st = moe_layer_create(ctx, &lc, &layer);
    fz_check_message(ctx, st, "moe_layer_create");
    if (st == MOE_OK) {
        moe_step *step = NULL;
        st = moe_step_create(layer, NULL, &step);
        FZ_CHECK(st == MOE_OK, "moe_step_create with a NULL config: %d", st);
        int64_t T = fz_range(f, 0, 4), H = lc.hidden_size;
        size_t es = lc.param_dtype == MOE_DTYPE_FP64 ? 8 : lc.param_dtype == MOE_DTYPE_BF16 ? 2 : 4;
        char *xb = calloc((size_t)(T * H) + 1, es), *yb = calloc((size_t)(T * H) + 1, es);
        int64_t shape[2] = {T, H};
        DLTensor x = {xb, {kDLCPU, 0}, 2, fz_dl_of(lc.param_dtype), shape, NULL, 0};
        DLTensor y = {yb, {kDLCPU, 0}, 2, fz_dl_of(lc.param_dtype), shape, NULL, 0};
        st = moe_layer_forward(layer, step, &x, &y, NULL);
        fz_check_message(ctx, st, "moe_layer_forward");
        FZ_CHECK(ps.depth == 0, "%d profiler ranges open after moe_layer_forward returned %d", ps.depth, st);
        st = moe_layer_forward(layer, step, NULL, &y, NULL);
        FZ_CHECK(st == MOE_ERR_INVALID_ARGUMENT, "moe_layer_forward with x NULL: %d", st);
        fz_check_message(ctx, st, "moe_layer_forward");
        FZ_CHECK(ps.depth == 0, "profiler ranges open after a refused forward");
        moe_memory_stats ms;
        ms.struct_size = sizeof ms;
        FZ_CHECK(moe_context_memory_stats(ctx, &ms) == MOE_OK, "moe_context_memory_stats");
        moe_step_destroy(step);
        moe_layer_destroy(layer);
        free(xb);
        free(yb);
    }
    st = moe_context_memory_trim(ctx, NULL);
    FZ_CHECK(st == MOE_OK, "moe_context_memory_trim: %d", st);
    const int adopted_alloc = full.allocator && al.release; /* create succeeded: every table was adopted */
    const int adopted_log = full.logger && lg.release;
    const int adopted_prof = full.profiler && pr.release;
    moe_context_destroy(ctx);
    FZ_CHECK(as.released == adopted_alloc, "allocator released %d times (adopted with release: %d)", as.released,
             adopted_alloc);
    FZ_CHECK(ls.released == adopted_log, "logger released %d times", ls.released);
    FZ_CHECK(ps.released == adopted_prof, "profiler released %d times", ps.released);
}

/* ---------------------------------------------------------------- layer, get_config, step */
static void run_layer(fz *f)
{
    fz_alloc a;
    moe_context *ctx = fz_context(&a, (size_t)4 << 20);
    moe_layer_config full;
    memset(&full, 0, sizeof full);
    if (!raw_body(f, &full, sizeof full)) fz_layer_fields(f, &full, 1);
    host h;
    host_make(f, &full, sizeof full, &h);
    moe_layer *sentinel = (moe_layer *)(uintptr_t)0x10, *layer = sentinel;
    int32_t st = moe_layer_create(ctx, h.buf, &layer);
    check_header(&h, st, "moe_layer_create");
    fz_check_message(ctx, st, "moe_layer_create");
    free(h.buf);
    if (st != MOE_OK) {
        FZ_CHECK(layer == sentinel, "moe_layer_create failed but wrote *out");
        fz_context_done(ctx, &a);
        return;
    }
    /* get_config into a host struct of any size */
    {
        uint8_t m = fz_u8(f);
        uint32_t sz = m < 128 ? (uint32_t)sizeof(moe_layer_config)
                    : m < 192 ? (uint32_t)offsetof(moe_layer_config, graphs)
                              : (uint32_t)fz_range(f, 0, sizeof(moe_layer_config) + 64);
        size_t bytes = sz < 4 ? 4 : sz;
        unsigned char *out = malloc(bytes);
        memset(out, 0xa5, bytes);
        memcpy(out, &sz, 4);
        st = moe_layer_get_config(layer, (moe_layer_config *)out);
        fz_check_message(ctx, st, "moe_layer_get_config");
        if (st == MOE_OK && sz >= sizeof(moe_layer_config)) {
            moe_layer_config got;
            memcpy(&got, out, sizeof got);
            FZ_CHECK(got.hidden_size == full.hidden_size && got.num_experts == full.num_experts,
                     "moe_layer_get_config returned another layer's sizes");
            for (size_t i = sizeof(moe_layer_config); i < bytes; i++)
                FZ_CHECK(out[i] == 0xa5, "moe_layer_get_config wrote beyond its struct (byte %zu)", i);
        }
        free(out);
    }
    /* a step from a host step config */
    {
        moe_step_config sf;
        memset(&sf, 0, sizeof sf);
        if (!raw_body(f, &sf, sizeof sf)) {
            static const float scales[] = {0.0f, 1.0f, 0.5f, 1024.0f};
            sf.mode = fz_dim32(f, 0, 2);
            sf.aux_loss_scale = fz_float(f, scales, 4);
        }
        host hs;
        host_make(f, &sf, sizeof sf, &hs);
        moe_step *ssent = (moe_step *)(uintptr_t)0x10, *step = ssent;
        const int use_null = fz_u8(f) >= 240;
        st = moe_step_create(layer, use_null ? NULL : hs.buf, &step);
        if (!use_null) check_header(&hs, st, "moe_step_create");
        fz_check_message(ctx, st, "moe_step_create");
        free(hs.buf);
        if (st == MOE_OK) {
            moe_routing_stats rs;
            rs.struct_size = sizeof rs;
            st = moe_step_routing_stats(step, &rs);
            FZ_CHECK(st == MOE_ERR_STATE, "routing stats before any forward: %d", st);
            moe_step_destroy(step);
        } else {
            FZ_CHECK(step == ssent, "moe_step_create failed but wrote *out");
        }
    }
    /* memory stats into a host struct of any size */
    {
        uint32_t sz = fz_u8(f) < 128 ? (uint32_t)sizeof(moe_memory_stats) : (uint32_t)fz_range(f, 0, sizeof(moe_memory_stats) + 32);
        size_t bytes = sz < 4 ? 4 : sz;
        unsigned char *out = malloc(bytes);
        memset(out, 0xa5, bytes);
        memcpy(out, &sz, 4);
        st = moe_context_memory_stats(ctx, (moe_memory_stats *)out);
        fz_check_message(ctx, st, "moe_context_memory_stats");
        free(out);
    }
    /* the gradient report into a host struct of any size: nothing written past what it says it holds,
     * nothing at all on failure */
    {
        uint32_t sz = fz_u8(f) < 128 ? (uint32_t)sizeof(moe_nonfinite_report)
                                     : (uint32_t)fz_range(f, 0, sizeof(moe_nonfinite_report) + 32);
        size_t bytes = (sz < 4 ? 4 : sz) + 16;
        unsigned char *out = malloc(bytes), *copy = malloc(bytes);
        memset(out, 0xa5, bytes);
        memcpy(out, &sz, 4);
        memcpy(copy, out, bytes);
        st = moe_layer_check_gradients(layer, (moe_nonfinite_report *)out, NULL);
        fz_check_message(ctx, st, "moe_layer_check_gradients");
        if (st != MOE_OK) FZ_CHECK(memcmp(out, copy, bytes) == 0, "moe_layer_check_gradients failed but wrote out");
        else {
            uint32_t n = 0;
            memcpy(&n, out, 4);
            FZ_CHECK(n <= sz && n <= sizeof(moe_nonfinite_report), "report struct_size %u > %u", n, sz);
            FZ_CHECK(memcmp(out + n, copy + n, bytes - n) == 0, "moe_layer_check_gradients wrote past struct_size");
        }
        free(out);
        free(copy);
    }
    moe_layer_destroy(layer);
    fz_context_done(ctx, &a);
}

/* ---------------------------------------------------------------- comms */
/* A comm for the pool of create calls: 0 none, 1 self, 2 hooks (size n), 3 a comm of another context. */
typedef struct comm_pool {
    moe_comm *self, *hooks, *foreign;
    hooks_state hs;
    moe_context *other;
    fz_alloc other_alloc;
} comm_pool;

static void pool_make(fz *f, moe_context *ctx, comm_pool *p)
{
    memset(p, 0, sizeof *p);
    FZ_CHECK(moe_comm_create_self(ctx, NULL, &p->self) == MOE_OK, "moe_comm_create_self");
    int32_t size = (int32_t)fz_range(f, 1, 4), rank = (int32_t)fz_range(f, 0, size - 1);
    moe_comm_hooks ht = hooks_table(&p->hs, rank, size);
    FZ_CHECK(moe_comm_create_hooks(ctx, NULL, &ht, &p->hooks) == MOE_OK, "moe_comm_create_hooks");
    p->other = fz_context(&p->other_alloc, (size_t)1 << 20);
    FZ_CHECK(moe_comm_create_self(p->other, NULL, &p->foreign) == MOE_OK, "moe_comm_create_self (other)");
}

static moe_comm *pool_pick(fz *f, comm_pool *p)
{
    switch (fz_u8(f) % 8) {
    case 1: return p->self;
    case 2: return p->hooks;
    case 3: return fz_u8(f) >= 128 ? p->foreign : NULL;
    default: return NULL;
    }
}

static void pool_done(comm_pool *p)
{
    moe_comm_destroy(p->self);
    moe_comm_destroy(p->hooks);
    FZ_CHECK(p->hs.released == 1, "comm hooks not released once the comm and its users are gone");
    moe_comm_destroy(p->foreign);
    fz_context_done(p->other, &p->other_alloc);
}

static void run_comm(fz *f)
{
    fz_alloc a;
    moe_context *ctx = fz_context(&a, (size_t)1 << 20);
    moe_comm_config full;
    memset(&full, 0, sizeof full);
    if (!raw_body(f, &full, sizeof full)) {
        full.timeout_ms = fz_dim32(f, 0, 1000);
        full.reserved0 = fz_u8(f) >= 240 ? (int32_t)fz_u32(f) : 0;
    }
    host h;
    host_make(f, &full, sizeof full, &h);
    const moe_comm_config *cfg = fz_u8(f) >= 224 ? NULL : h.buf;
    moe_comm *sentinel = (moe_comm *)(uintptr_t)0x10, *c = sentinel;
    uint8_t kind = fz_u8(f) % 4;
    int32_t st;
    hooks_state hs = {0, 0, 0};
    int has_release = 0;
    if (kind == 0) {
        st = moe_comm_create_self(ctx, cfg, &c);
    } else if (kind == 1) {
        int32_t size = fz_dim32(f, 1, 4), rank = fz_dim32(f, 0, 3);
        moe_comm_hooks ht = hooks_table(&hs, rank, size);
        ht.reserved0 = fz_u8(f) >= 240 ? (int32_t)fz_u32(f) : 0;
        uint8_t missing = fz_u8(f) >= 224 ? fz_u8(f) : 0;
        if (missing & 1) ht.all_to_all_v = NULL;
        if (missing & 2) ht.all_gather_v = NULL;
        if (missing & 4) ht.all_reduce = NULL;
        if (missing & 8) ht.broadcast = NULL;
        if (missing & 16) ht.barrier = NULL;
        if (missing & 32) ht.release = NULL;
        has_release = ht.release != NULL;
        /* a host table of struct_size bytes (older, newer with zero tail, or tiny) */
        uint32_t tsz = fz_u8(f) < 224 ? (uint32_t)sizeof ht : (uint32_t)fz_range(f, 4, sizeof ht + 32);
        ht.struct_size = tsz;
        unsigned char *tb = calloc(1, tsz > sizeof ht ? tsz : sizeof ht);
        memcpy(tb, &ht, sizeof ht); /* the table's own bytes; a shorter host table has the same prefix */
        unsigned char *tab = malloc(tsz);
        memcpy(tab, tb, tsz);
        free(tb);
        st = moe_comm_create_hooks(ctx, cfg, fz_u8(f) >= 250 ? NULL : (const moe_comm_hooks *)tab, &c);
        free(tab);
        if (st == MOE_OK) FZ_CHECK(rank >= 0 && rank < size && size >= 1, "hooks with rank %d of %d accepted", rank, size);
        FZ_CHECK(!hs.released, "a comm's hooks released at create");
    } else if (kind == 2) {
        st = moe_comm_create_mpi(ctx, cfg, NULL, &c);
        FZ_CHECK(st != MOE_OK, "moe_comm_create_mpi succeeded in a build without MPI");
    } else {
        size_t len = (size_t)fz_range(f, 0, 200);
        unsigned char *id = malloc(len ? len : 1);
        fz_bytes(f, id, len);
        st = moe_comm_create_nccl(ctx, cfg, fz_u8(f) >= 240 ? NULL : id, len, fz_dim32(f, 0, 1), fz_dim32(f, 1, 2), &c);
        FZ_CHECK(st != MOE_OK, "moe_comm_create_nccl succeeded in a build without NCCL");
        free(id);
        size_t cap = (size_t)fz_range(f, 0, 200), got = 0;
        unsigned char *ub = malloc(cap ? cap : 1);
        int32_t su = moe_comm_nccl_unique_id(ub, cap, &got);
        FZ_CHECK(su != MOE_OK, "moe_comm_nccl_unique_id succeeded in a build without NCCL");
        fz_check_message(NULL, su, "moe_comm_nccl_unique_id");
        free(ub);
    }
    if (cfg && kind == 0) check_header(&h, st, "moe_comm_create_self");
    fz_check_message(ctx, st, "moe_comm_create_*");
    free(h.buf);
    if (st != MOE_OK) {
        FZ_CHECK(c == sentinel, "a failed comm create wrote *out");
        fz_context_done(ctx, &a);
        return;
    }
    int32_t v = 0;
    FZ_CHECK(moe_comm_rank(c, &v) == MOE_OK && moe_comm_size(c, &v) == MOE_OK && moe_comm_kind(c, &v) == MOE_OK,
             "moe_comm_rank / size / kind");
    FZ_CHECK(moe_comm_rank(c, NULL) == MOE_ERR_INVALID_ARGUMENT, "moe_comm_rank(NULL)");
    moe_comm *sub = sentinel;
    st = moe_comm_split(c, (int32_t)fz_odd(f), (int32_t)fz_odd(f), &sub);
    fz_check_message(ctx, st, "moe_comm_split");
    if (st == MOE_OK) moe_comm_destroy(sub);
    else FZ_CHECK(sub == sentinel, "a failed moe_comm_split wrote *out");
    moe_comm_destroy(c);
    if (kind == 1) FZ_CHECK(hs.released == has_release, "comm hooks released %d times", hs.released);
    fz_context_done(ctx, &a);
}

/* ---------------------------------------------------------------- dispatcher */
static void run_dispatcher(fz *f)
{
    fz_alloc a;
    moe_context *ctx = fz_context(&a, (size_t)1 << 20);
    comm_pool pool;
    pool_make(f, ctx, &pool);
    moe_dispatcher_config full;
    memset(&full, 0, sizeof full);
    if (!raw_body(f, &full, sizeof full)) {
        static const double caps[] = {0, 1, 1.25, 0.5, 1e6, 1e6 + 1, -1, 1e300};
        full.kind = fz_dim32(f, 0, 1);
        full.dtype = fz_dim32(f, 0, 2);
        full.hidden = fz_dim(f, 1, 16);
        full.num_experts = fz_dim32(f, 1, 8);
        full.top_k = fz_dim32(f, 1, 8);
        uint8_t cm = fz_u8(f);
        full.capacity_factor = cm < 224 ? caps[cm % 8] : cm < 240 ? NAN : cm < 248 ? INFINITY : (double)fz_odd(f);
        full.drop_policy = fz_dim32(f, 0, 1);
        full.pad_to_capacity = fz_dim32(f, 0, 1);
        full.combine = fz_dim32(f, 0, 1);
        full.reserved0 = fz_u8(f) >= 240 ? (int32_t)fz_u32(f) : 0;
    }
    host h;
    host_make(f, &full, sizeof full, &h);
    moe_dispatcher *sentinel = (moe_dispatcher *)(uintptr_t)0x10, *d = sentinel;
    moe_comm *ep = pool_pick(f, &pool);
    int32_t st = moe_dispatcher_create(ctx, h.buf, ep, &d);
    check_header(&h, st, "moe_dispatcher_create");
    fz_check_message(ctx, st, "moe_dispatcher_create");
    free(h.buf);
    if (st == MOE_OK) {
        int32_t nl = -1, first = -1;
        FZ_CHECK(moe_dispatcher_local_experts(d, &nl, &first) == MOE_OK, "moe_dispatcher_local_experts");
        FZ_CHECK(nl >= 1 && first >= 0, "local experts %d from %d", nl, first);
        FZ_CHECK(moe_dispatcher_local_experts(d, NULL, NULL) == MOE_OK, "moe_dispatcher_local_experts(NULL, NULL)");
        moe_dispatcher_destroy(d);
    } else {
        FZ_CHECK(d == sentinel, "a failed moe_dispatcher_create wrote *out");
    }
    pool_done(&pool);
    fz_context_done(ctx, &a);
}

/* ---------------------------------------------------------------- parallel layers */
static void run_parallel(fz *f)
{
    fz_alloc a;
    moe_context *ctx = fz_context(&a, (size_t)4 << 20);
    comm_pool pool;
    pool_make(f, ctx, &pool);
    moe_parallel_config full;
    memset(&full, 0, sizeof full);
    int raw = raw_body(f, &full, sizeof full);
    /* comm pointers are handles: always real ones (or NULL), raw body or not */
    full.ep_comm = pool_pick(f, &pool);
    full.etp_comm = pool_pick(f, &pool);
    full.aux_comm = pool_pick(f, &pool);
    full.edp_comm = pool_pick(f, &pool);
    full.dp_comm = pool_pick(f, &pool);
    full.bias_comm = pool_pick(f, &pool);
    if (!raw) {
        full.dispatcher = fz_dim32(f, 0, 1);
        full.num_chunks = fz_dim32(f, 0, 8);
    }
    host h;
    host_make(f, &full, sizeof full, &h);
    moe_layer_config lc;
    moe_layer_config_init(&lc, sizeof lc);
    fz_layer_fields(f, &lc, 0);
    moe_layer *sentinel = (moe_layer *)(uintptr_t)0x10, *layer = sentinel;
    int32_t st = moe_layer_create_parallel(ctx, &lc, fz_u8(f) >= 248 ? NULL : h.buf, &layer);
    fz_check_message(ctx, st, "moe_layer_create_parallel");
    free(h.buf);
    if (st == MOE_OK) moe_layer_destroy(layer);
    else FZ_CHECK(layer == sentinel, "a failed moe_layer_create_parallel wrote *out");
    pool_done(&pool);
    fz_context_done(ctx, &a);
}

/* ---------------------------------------------------------------- layouts */
static void run_layout(fz *f)
{
    moe_layout_config full;
    memset(&full, 0, sizeof full);
    int raw = raw_body(f, &full, sizeof full);
    static const char *const orders[] = {NULL, "tp-cp-ep-dp-pp", "tp-cp-dp-pp", "ep-tp-cp-dp-pp", "tp-cp-ep-dp",
                                         "", "tp-tp-ep-dp-pp", "pp-dp-ep-cp-tp", "tp-cp-ep-dp-pp-", "x"};
    char order[32];
    uint8_t om = fz_u8(f);
    if (om < 200) {
        full.order = orders[om % (sizeof orders / sizeof orders[0])];
    } else {
        size_t n = (size_t)fz_range(f, 0, sizeof order - 1);
        fz_bytes(f, order, n);
        order[n] = '\0';
        full.order = order;
    }
    if (!raw) {
        full.world_size = fz_dim32(f, 1, 16);
        full.tp = fz_dim32(f, 0, 4);
        full.cp = fz_dim32(f, 0, 2);
        full.dp = fz_dim32(f, 0, 4);
        full.pp = fz_dim32(f, 0, 2);
        full.etp = fz_dim32(f, 0, 2);
        full.ep = fz_dim32(f, 0, 4);
    }
    host h;
    host_make(f, &full, sizeof full, &h);
    moe_layout *sentinel = (moe_layout *)(uintptr_t)0x10, *lay = sentinel;
    int32_t st = moe_layout_create(h.buf, &lay);
    check_header(&h, st, "moe_layout_create");
    fz_check_message(NULL, st, "moe_layout_create");
    free(h.buf);
    if (st != MOE_OK) {
        FZ_CHECK(lay == sentinel, "a failed moe_layout_create wrote *out");
        return;
    }
    int32_t s[7];
    FZ_CHECK(moe_layout_sizes(lay, &s[0], &s[1], &s[2], &s[3], &s[4], &s[5], &s[6]) == MOE_OK, "moe_layout_sizes");
    FZ_CHECK(moe_layout_sizes(lay, NULL, NULL, NULL, NULL, NULL, NULL, NULL) == MOE_OK, "moe_layout_sizes(NULL...)");
    for (int k = 0; k < 4; k++) {
        int32_t rank = fz_dim32(f, 0, 15), group = fz_dim32(f, 0, MOE_GROUP_NUM - 1);
        int32_t cap = fz_u8(f) < 200 ? (int32_t)fz_range(f, 0, 16) : (int32_t)fz_odd(f);
        int32_t *members = (cap >= 0 && cap <= 64 && fz_u8(f) < 224) ? malloc(sizeof(int32_t) * (size_t)(cap ? cap : 1)) : NULL;
        int32_t count = -1, index = -1;
        st = moe_layout_group(lay, rank, group, members, members ? cap : (int32_t)fz_odd(f), &count, &index);
        fz_check_message(NULL, st, "moe_layout_group");
        if (st == MOE_OK) FZ_CHECK(count >= 1 && index >= 0 && index < count, "group of %d, index %d", count, index);
        free(members);
    }
    /* splitting a one-rank world by the layout (a self comm); others must be refused */
    fz_alloc a;
    moe_context *ctx = fz_context(&a, (size_t)1 << 20);
    moe_comm *world = NULL, *sub = (moe_comm *)(uintptr_t)0x10;
    FZ_CHECK(moe_comm_create_self(ctx, NULL, &world) == MOE_OK, "moe_comm_create_self");
    st = moe_comm_split_layout(world, lay, fz_dim32(f, 0, MOE_GROUP_NUM - 1), &sub);
    fz_check_message(ctx, st, "moe_comm_split_layout");
    if (st == MOE_OK) {
        FZ_CHECK(s[0] * s[1] * s[2] * s[3] == 1, "a layout of more than one rank split a one-rank world");
        moe_comm_destroy(sub);
    }
    moe_comm_destroy(world);
    fz_context_done(ctx, &a);
    moe_layout_destroy(lay);
}

/* ---------------------------------------------------------------- planner */
static void run_plan(fz *f)
{
    moe_plan_model mf;
    moe_plan_parallel pf;
    memset(&mf, 0, sizeof mf);
    memset(&pf, 0, sizeof pf);
    if (fz_u8(f) < 64) { /* a preset, then the estimate of it */
        static const char *const names[] = {"deepseek-v3", "qwen3-235b-a22b", "mixtral-8x7b", "", "mixtral", "DEEPSEEK-V3"};
        moe_plan_model_init(&mf, sizeof mf);
        moe_plan_parallel_init(&pf, sizeof pf);
        host hm, hp;
        host_make(f, &mf, sizeof mf, &hm);
        host_make(f, &pf, sizeof pf, &hp);
        const char *name = fz_u8(f) >= 250 ? NULL : names[fz_u8(f) % 6];
        int32_t st = moe_plan_model_preset(name, fz_u8(f) >= 250 ? NULL : hm.buf, fz_u8(f) >= 192 ? NULL : hp.buf);
        fz_check_message(NULL, st, "moe_plan_model_preset");
        if (st == MOE_OK) {
            moe_plan_result r;
            r.struct_size = sizeof r;
            st = moe_plan_estimate(hm.buf, hp.buf, &r);
            fz_check_message(NULL, st, "moe_plan_estimate");
        }
        free(hm.buf);
        free(hp.buf);
        return;
    }
    if (!raw_body(f, &mf, sizeof mf)) {
        mf.num_layers = fz_dim32(f, 1, 8);
        mf.first_dense_layers = fz_dim32(f, 0, 2);
        mf.moe_layer_freq = fz_dim32(f, 0, 2);
        mf.num_experts = fz_dim32(f, 0, 16);
        mf.top_k = fz_dim32(f, 1, 4);
        mf.num_shared_experts = fz_dim32(f, 0, 2);
        mf.hidden_size = fz_dim(f, 1, 4096);
        mf.ffn_hidden_size = fz_dim(f, 1, 8192);
        mf.moe_ffn_hidden_size = fz_dim(f, 1, 2048);
        mf.shared_ffn_hidden_size = fz_dim(f, 0, 2048);
        mf.vocab_size = fz_dim(f, 1, 65536);
        mf.activation = fz_dim32(f, 0, 4);
        mf.tied_embeddings = fz_dim32(f, 0, 1);
        mf.attention = fz_dim32(f, 0, 1);
        mf.num_heads = fz_dim32(f, 1, 32);
        mf.num_kv_heads = fz_dim32(f, 0, 8);
        mf.head_dim = fz_dim32(f, 0, 128);
        mf.q_lora_rank = fz_dim32(f, 0, 512);
        mf.kv_lora_rank = fz_dim32(f, 0, 512);
        mf.qk_rope_head_dim = fz_dim32(f, 0, 64);
        mf.v_head_dim = fz_dim32(f, 0, 128);
    }
    if (!raw_body(f, &pf, sizeof pf)) {
        pf.tp = fz_dim32(f, 0, 2), pf.cp = fz_dim32(f, 0, 2), pf.dp = fz_dim32(f, 0, 4), pf.pp = fz_dim32(f, 0, 2);
        pf.vpp = fz_dim32(f, 0, 2), pf.ep = fz_dim32(f, 0, 4), pf.etp = fz_dim32(f, 0, 2);
        pf.micro_batch = fz_dim32(f, 0, 2);
        pf.seq_length = fz_dim(f, 1, 4096);
        pf.num_micro_batches = fz_dim32(f, 0, 8);
        pf.param_bytes = fz_dim32(f, 0, 4), pf.grad_bytes = fz_dim32(f, 0, 4);
        pf.optimizer_bytes = fz_dim32(f, 0, 16), pf.activation_bytes = fz_dim32(f, 0, 4);
        pf.distributed_optimizer = fz_dim32(f, 0, 1);
        pf.recompute = fz_dim32(f, 0, 2);
        pf.offload = fz_dim32(f, 0, 3);
        pf.device_memory_bytes = fz_dim(f, 0, (int64_t)1 << 40);
    }
    host hm, hp;
    host_make(f, &mf, sizeof mf, &hm);
    host_make(f, &pf, sizeof pf, &hp);
    uint32_t rsz = fz_u8(f) < 224 ? (uint32_t)sizeof(moe_plan_result) : (uint32_t)fz_range(f, 0, sizeof(moe_plan_result) + 32);
    size_t rbytes = rsz < 4 ? 4 : rsz;
    unsigned char *rb = malloc(rbytes);
    memset(rb, 0xa5, rbytes);
    memcpy(rb, &rsz, 4);
    int32_t st = moe_plan_estimate(hm.buf, hp.buf, (moe_plan_result *)rb);
    check_header_of(&hm, st, "moe_plan_estimate (model)", 0);
    check_header_of(&hp, st, "moe_plan_estimate (par)", 0);
    fz_check_message(NULL, st, "moe_plan_estimate");
    free(rb);
    free(hm.buf);
    free(hp.buf);
}

/* ---------------------------------------------------------------- *_init functions */
static void run_init(fz *f)
{
    typedef int32_t (*init_fn)(void *, size_t);
    static const struct {
        init_fn fn;
        size_t size;
    } inits[] = {
        {(init_fn)moe_context_config_init, sizeof(moe_context_config)},
        {(init_fn)moe_layer_config_init, sizeof(moe_layer_config)},
        {(init_fn)moe_step_config_init, sizeof(moe_step_config)},
        {(init_fn)moe_comm_config_init, sizeof(moe_comm_config)},
        {(init_fn)moe_layout_config_init, sizeof(moe_layout_config)},
        {(init_fn)moe_parallel_config_init, sizeof(moe_parallel_config)},
        {(init_fn)moe_dispatcher_config_init, sizeof(moe_dispatcher_config)},
        {(init_fn)moe_plan_model_init, sizeof(moe_plan_model)},
        {(init_fn)moe_plan_parallel_init, sizeof(moe_plan_parallel)},
    };
    const int n = (int)(sizeof inits / sizeof inits[0]);
    int k = fz_u8(f) % n;
    uint8_t m = fz_u8(f);
    size_t sz = m < 128 ? inits[k].size : (size_t)fz_range(f, 0, (int64_t)inits[k].size + 64);
    unsigned char *buf = m >= 250 ? NULL : malloc(sz ? sz : 1);
    if (buf) memset(buf, 0xa5, sz);
    int32_t st = inits[k].fn(buf, sz);
    fz_check_message(NULL, st, "*_init");
    if (st == MOE_OK) {
        FZ_CHECK(buf && sz >= 16, "*_init accepted %zu bytes", sz);
        uint32_t s32, ver;
        memcpy(&s32, buf, 4);
        memcpy(&ver, buf + 4, 4);
        FZ_CHECK(s32 == sz && ver == MOE_API_VERSION, "*_init wrote struct_size %u, api_version %u", s32, ver);
        for (size_t i = 8; i < sz; i++) FZ_CHECK(buf[i] == 0, "*_init left byte %zu non-zero", i);
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    switch (fz_u8(&f) % 9) {
    case 0: run_context(&f); break;
    case 1: run_layer(&f); break;
    case 2: run_comm(&f); break;
    case 3: run_dispatcher(&f); break;
    case 4: run_parallel(&f); break;
    case 5: run_layout(&f); break;
    case 6: run_plan(&f); break;
    case 7: run_init(&f); break;
    default: run_layer(&f); break;
    }
    return 0;
}

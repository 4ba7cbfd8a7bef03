/*
 * fuzz_comm_hooks: communicator hook results. A moe_comm_hooks table plays this rank's peers (EP
 * of 2 to 4 ranks, optionally a second table for ETP 2): what the peers deliver and what each
 * callback returns come from the input. Behind it run a layer spread over the hooks (all-to-all or
 * all-gather dispatcher, chunked or not, gradient reductions over DP / EDP, expert-bias counts over
 * the bias group) and the standalone dispatcher over the same hooks.
 *
 * Peer behaviours, per callback, from the input: "mirror" (every peer sends what this rank sends:
 * a consistent world), "noise" (the peers' blocks are random bytes), "counts" (8-byte words chosen
 * among small, negative and huge values: the row counts the dispatchers exchange first), reductions
 * that add NaN / huge values, and return codes (0, or a failure at the n-th call). The callbacks
 * always honour the engine's byte counts and offsets, as the hook contract requires: any write
 * outside the engine's buffers is the engine's miscomputed size, which ASan reports.
 *
 * Checks beyond "no crash, no undefined behaviour, no leak": a call during which a hook failed
 * fails, and the comm is broken afterwards (later collectives fail with MOE_ERR_COMM, no hook runs);
 * hooks never run after release, and release runs exactly once when the comm and its users are
 * gone; failures carry a message that begins with their status.
 */
#include "fuzz_common.h"

typedef struct peers {
    fz *f;
    int32_t rank, size;
    int32_t calls, fail_at, fail_rc; /* fail_at > 0: the fail_at-th callback returns fail_rc */
    int32_t failed;                  /* a callback returned non-zero since the last reset */
    int32_t broken_seen;             /* a callback failed once: the engine must not call again */
    int32_t released;
    uint32_t seed;
} peers;

/* 0 mirror, 1 noise, 2 counts */
static int behaviour(peers *p)
{
    uint8_t m = fz_u8(p->f);
    return m < 176 ? 0 : m < 216 ? 1 : 2;
}

static void fill(peers *p, int how, char *dst, const char *mirror, int64_t n, int64_t have)
{
    if (how == 0) {
        int64_t k = n < have ? n : have;
        if (k > 0) memcpy(dst, mirror, (size_t)k);
        if (n > k) memset(dst + k, 0, (size_t)(n - k));
        return;
    }
    if (how == 2 && n % 8 == 0) {
        for (int64_t i = 0; i < n; i += 8) {
            uint8_t m = fz_u8(p->f);
            int64_t v = m < 128 ? (int64_t)(m % 9) : m < 224 ? fz_odd(p->f) : (int64_t)fz_u64(p->f);
            memcpy(dst + i, &v, 8);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        p->seed = p->seed * 1664525u + 1013904223u;
        dst[i] = (char)(p->seed >> 24);
    }
}

static int32_t status(peers *p)
{
    FZ_CHECK(!p->released, "a comm hook ran after release");
    FZ_CHECK(!p->broken_seen, "a comm hook ran after an earlier one failed (the comm must be broken)");
    p->calls++;
    int32_t rc = 0;
    if (p->fail_at > 0 && p->calls == p->fail_at) rc = p->fail_rc ? p->fail_rc : 1;
    if (rc) p->failed = p->broken_seen = 1;
    return rc;
}

static int32_t a2a(void *ud, const void *send, const int64_t *sb, const int64_t *so, void *recv, const int64_t *rb,
                   const int64_t *ro)
{
    peers *p = ud;
    int32_t rc = status(p);
    if (rc) return rc;
    for (int32_t q = 0; q < p->size; q++) {
        FZ_CHECK(sb[q] >= 0 && so[q] >= 0 && rb[q] >= 0 && ro[q] >= 0, "all_to_all_v: negative count or offset");
        if (q == p->rank) { /* this rank's own block: always its own bytes */
            FZ_CHECK(sb[q] == rb[q], "all_to_all_v: this rank sends %lld bytes to itself but receives %lld",
                     (long long)sb[q], (long long)rb[q]);
            if (rb[q] > 0) memmove((char *)recv + ro[q], (const char *)send + so[q], (size_t)rb[q]);
        } else {
            fill(p, behaviour(p), (char *)recv + ro[q], (const char *)send + so[q], rb[q], sb[q]);
        }
    }
    return 0;
}

static int32_t ag(void *ud, const void *send, int64_t sb, void *recv, const int64_t *rb, const int64_t *ro)
{
    peers *p = ud;
    int32_t rc = status(p);
    if (rc) return rc;
    for (int32_t q = 0; q < p->size; q++) {
        FZ_CHECK(rb[q] >= 0 && ro[q] >= 0, "all_gather_v: negative count or offset");
        if (q == p->rank) {
            FZ_CHECK(rb[q] == sb, "all_gather_v: own block of %lld bytes, send of %lld", (long long)rb[q], (long long)sb);
            if (sb > 0) memmove((char *)recv + ro[q], send, (size_t)sb);
        } else {
            fill(p, behaviour(p), (char *)recv + ro[q], send, rb[q], sb);
        }
    }
    return 0;
}

static int32_t ar(void *ud, void *buf, int64_t count, int32_t dtype)
{
    peers *p = ud;
    int32_t rc = status(p);
    if (rc) return rc;
    FZ_CHECK(count >= 0, "all_reduce: count %lld", (long long)count);
    FZ_CHECK(dtype == MOE_DTYPE_FP32 || dtype == MOE_DTYPE_FP64 || dtype == MOE_DTYPE_INT64, "all_reduce: dtype %d", dtype);
    uint8_t m = fz_u8(p->f);
    for (int64_t i = 0; i < count; i++) {
        if (dtype == MOE_DTYPE_INT64) {
            int64_t v;
            memcpy(&v, (char *)buf + i * 8, 8);
            uint64_t u = (uint64_t)v * (uint64_t)p->size; /* mirror: every rank held the same */
            if (m >= 192) u = (uint64_t)(m >= 240 ? fz_odd(p->f) : (int64_t)(fz_u8(p->f) % 9));
            memcpy((char *)buf + i * 8, &u, 8);
        } else if (dtype == MOE_DTYPE_FP64) {
            double v;
            memcpy(&v, (char *)buf + i * 8, 8);
            v = m >= 224 ? (m & 1 ? NAN : 1e308) : v * p->size;
            memcpy((char *)buf + i * 8, &v, 8);
        } else {
            float v;
            memcpy(&v, (char *)buf + i * 4, 4);
            v = m >= 224 ? (m & 1 ? NAN : 3e38f) : v * (float)p->size;
            memcpy((char *)buf + i * 4, &v, 4);
        }
    }
    return 0;
}

static int32_t bc(void *ud, void *buf, int64_t bytes, int32_t root)
{
    peers *p = ud;
    int32_t rc = status(p);
    if (rc) return rc;
    FZ_CHECK(bytes >= 0 && root >= 0 && root < p->size, "broadcast: %lld bytes from %d", (long long)bytes, root);
    if (root != p->rank && behaviour(p) != 0) fill(p, 1, buf, NULL, bytes, 0);
    return 0;
}

static int32_t barrier(void *ud) { return status(ud); }

static void release(void *ud)
{
    peers *p = ud;
    FZ_CHECK(!p->released, "comm hooks released twice");
    p->released = 1;
}

static moe_comm *make_comm(fz *f, moe_context *ctx, peers *p, int32_t size)
{
    memset(p, 0, sizeof *p);
    p->f = f;
    p->size = size;
    p->rank = (int32_t)fz_range(f, 0, size - 1);
    p->seed = fz_u32(f) | 1u;
    moe_comm_hooks h = {sizeof h, p->rank, size, 0, p, a2a, ag, ar, bc, fz_bit(f) ? barrier : NULL, release};
    moe_comm *c = NULL;
    FZ_CHECK(moe_comm_create_hooks(ctx, NULL, &h, &c) == MOE_OK, "moe_comm_create_hooks");
    return c;
}

/* Arms a failure for the coming call: now and then the n-th callback fails. */
static void arm(fz *f, peers *p)
{
    p->failed = 0;
    if (fz_u8(f) >= 216) {
        p->fail_at = p->calls + (int32_t)fz_range(f, 1, 6);
        p->fail_rc = fz_u8(f) < 128 ? 1 : (int32_t)fz_odd(f);
    } else {
        p->fail_at = 0;
    }
}

/* After an engine call: a failed hook fails the call. */
static void after(const peers *p, int32_t st, const char *call)
{
    if (p && p->failed) FZ_CHECK(st != MOE_OK, "%s succeeded although a comm hook returned an error", call);
}

/* A compact, real tensor of the given shape and dtype with random values. */
typedef struct buf {
    DLTensor t;
    int64_t shape[2];
    void *mem;
} buf;

static void buf_make(fz *f, buf *b, int32_t ndim, int64_t d0, int64_t d1, DLDataType dt)
{
    memset(b, 0, sizeof *b);
    b->shape[0] = d0, b->shape[1] = d1;
    int64_t n = ndim == 1 ? d0 : d0 * d1;
    size_t es = dt.bits / 8;
    b->mem = malloc((size_t)n * es + 1);
    uint32_t seed = fz_u32(f) | 1u;
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        float v = (float)((int32_t)(seed >> 8) - (1 << 23)) / (float)(1 << 23);
        char *e = (char *)b->mem + i * (int64_t)es;
        if (dt.code == kDLInt) {
            int64_t iv = (int64_t)(seed >> 29);
            if (es == 8) memcpy(e, &iv, 8);
            else {
                int32_t i32 = (int32_t)iv;
                memcpy(e, &i32, 4);
            }
        } else if (es == 8) {
            double d = v;
            memcpy(e, &d, 8);
        } else if (es == 4) {
            memcpy(e, &v, 4);
        } else {
            uint32_t u;
            memcpy(&u, &v, 4);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy(e, &h, 2);
        }
    }
    DLTensor t = {b->mem, {kDLCPU, 0}, ndim, dt, b->shape, NULL, 0};
    b->t = t;
}

static void buf_free(buf *b) { free(b->mem); }

/* ---------------------------------------------------------------- a layer over the hooks */
static void run_layer(fz *f, moe_context *ctx)
{
    peers pe, pt;
    const int32_t P = (int32_t)fz_range(f, 2, 4), Q = fz_u8(f) >= 200 ? 2 : 1;
    moe_comm *ep = make_comm(f, ctx, &pe, P);
    moe_comm *etp = Q > 1 ? make_comm(f, ctx, &pt, Q) : NULL;
    moe_layer_config c;
    moe_layer_config_init(&c, sizeof c);
    fz_layer_fields(f, &c, 0);
    c.num_experts = P * (int32_t)fz_range(f, 1, 2);
    if (c.top_k > c.num_experts) c.top_k = c.num_experts;
    c.ffn_hidden_size = Q * fz_range(f, 1, 8);
    c.num_groups = c.group_topk = 0;
    c.recompute &= ~MOE_LAYER_RECOMPUTE_EXPERT_MLP; /* one rank only */
    moe_parallel_config par;
    moe_parallel_config_init(&par, sizeof par);
    par.ep_comm = ep;
    par.etp_comm = etp;
    moe_comm *pick[3] = {NULL, ep, etp};
    par.aux_comm = pick[fz_u8(f) % 3];
    par.edp_comm = pick[fz_u8(f) % 3];
    par.dp_comm = pick[fz_u8(f) % 3];
    par.bias_comm = pick[fz_u8(f) % 3];
    par.dispatcher = (int32_t)fz_range(f, 0, 1);
    par.num_chunks = par.dispatcher == MOE_DISPATCHER_ALL_TO_ALL ? (int32_t)fz_range(f, 0, 4) : 0;
    moe_layer *layer = NULL;
    int32_t st = moe_layer_create_parallel(ctx, &c, &par, &layer);
    fz_check_message(ctx, st, "moe_layer_create_parallel");
    if (st == MOE_OK) {
        moe_step *step = NULL;
        FZ_CHECK(moe_step_create(layer, NULL, &step) == MOE_OK, "moe_step_create");
        const DLDataType dt = fz_dl_of(c.param_dtype);
        int64_t T = 0;
        for (int op = 0; op < 6 && f->n > 0; op++) {
            uint8_t code = fz_u8(f) % 6;
            peers *p = (etp && (fz_u8(f) & 1)) ? &pt : &pe;
            arm(f, p);
            if (code <= 1) {
                T = fz_range(f, 0, 12);
                if (c.aux_loss_type == MOE_AUX_SEQUENCE) T = T / c.seq_length * c.seq_length;
                buf x, y;
                buf_make(f, &x, 2, T, c.hidden_size, dt);
                buf_make(f, &y, 2, T, c.hidden_size, dt);
                st = moe_layer_forward(layer, step, &x.t, &y.t, NULL);
                after(p, st, "moe_layer_forward");
                fz_check_message(ctx, st, "moe_layer_forward");
                buf_free(&x);
                buf_free(&y);
            } else if (code == 2) {
                buf dy, dx;
                buf_make(f, &dy, 2, T, c.hidden_size, dt);
                buf_make(f, &dx, 2, T, c.hidden_size, dt);
                st = moe_layer_backward(layer, step, &dy.t, &dx.t, NULL);
                after(p, st, "moe_layer_backward");
                fz_check_message(ctx, st, "moe_layer_backward");
                buf_free(&dy);
                buf_free(&dx);
            } else if (code == 3) {
                st = moe_layer_reduce_grads(layer, NULL);
                after(p, st, "moe_layer_reduce_grads");
                fz_check_message(ctx, st, "moe_layer_reduce_grads");
            } else if (code == 4) {
                st = moe_layer_update_expert_bias(layer, NULL);
                after(p, st, "moe_layer_update_expert_bias");
                fz_check_message(ctx, st, "moe_layer_update_expert_bias");
            } else {
                moe_routing_stats rs;
                rs.struct_size = sizeof rs;
                st = moe_step_routing_stats(step, &rs);
                fz_check_message(ctx, st, "moe_step_routing_stats");
                if (st == MOE_OK) FZ_CHECK(rs.num_tokens >= 0 && rs.dropped >= 0 && rs.padded_rows >= 0, "routing stats");
            }
            p->fail_at = 0;
        }
        moe_step_destroy(step);
        moe_layer_destroy(layer);
    }
    moe_comm_destroy(ep);
    FZ_CHECK(pe.released == 1, "EP hooks released %d times once the comm and the layer were gone", pe.released);
    if (etp) {
        moe_comm_destroy(etp);
        FZ_CHECK(pt.released == 1, "ETP hooks released %d times", pt.released);
    }
}

/* ---------------------------------------------------------------- the standalone dispatcher over the hooks */
static void run_dispatcher(fz *f, moe_context *ctx)
{
    peers pe;
    const int32_t P = (int32_t)fz_range(f, 2, 4);
    moe_comm *ep = make_comm(f, ctx, &pe, P);
    moe_dispatcher_config c;
    moe_dispatcher_config_init(&c, sizeof c);
    static const double caps[] = {0, 1, 1.25, 0.5};
    c.kind = (int32_t)fz_range(f, 0, 1);
    c.dtype = (int32_t)fz_range(f, 0, 2);
    c.hidden = fz_range(f, 1, 8);
    c.num_experts = P * (int32_t)fz_range(f, 1, 2);
    c.top_k = (int32_t)fz_range(f, 1, c.num_experts);
    c.capacity_factor = caps[fz_u8(f) % 4];
    c.pad_to_capacity = c.capacity_factor > 0 ? (int32_t)fz_range(f, 0, 1) : 0;
    c.combine = (int32_t)fz_range(f, 0, 1);
    moe_dispatcher *d = NULL;
    int32_t st = moe_dispatcher_create(ctx, &c, ep, &d);
    FZ_CHECK(st == MOE_OK, "moe_dispatcher_create: %d", st);
    const DLDataType dt = fz_dl_of(c.dtype);
    for (int round = 0; round < 2 && f->n > 0; round++) {
        const int64_t T = fz_range(f, 0, 8), H = c.hidden, K = c.top_k;
        buf x, ix, pr;
        buf_make(f, &x, 2, T, H, dt);
        buf_make(f, &ix, 2, T, K, fz_dl(kDLInt, 32));
        buf_make(f, &pr, 2, T, K, dt);
        for (int64_t t = 0; t < T; t++) /* valid routing: distinct experts per token */
            for (int64_t k = 0; k < K; k++) ((int32_t *)ix.mem)[t * K + k] = (int32_t)((t + k) % c.num_experts);
        arm(f, &pe);
        moe_dispatch *h = NULL;
        st = moe_dispatcher_dispatch(d, &x.t, &ix.t, fz_bit(f) ? &pr.t : NULL, &h, NULL);
        after(&pe, st, "moe_dispatcher_dispatch");
        fz_check_message(ctx, st, "moe_dispatcher_dispatch");
        pe.fail_at = 0;
        if (st == MOE_OK) {
            int64_t Rx = -1;
            FZ_CHECK(moe_dispatch_info(h, &Rx, NULL, NULL) == MOE_OK && Rx >= 0, "moe_dispatch_info: Rx %lld", (long long)Rx);
            buf yr, y, dy, dyr, dxr, dx;
            int64_t rows = Rx <= 4096 ? Rx : 0;
            buf_make(f, &yr, 2, rows, H, dt);
            buf_make(f, &y, 2, T, H, dt);
            arm(f, &pe);
            st = moe_dispatch_combine(h, &yr.t, &y.t, NULL);
            after(&pe, st, "moe_dispatch_combine");
            fz_check_message(ctx, st, "moe_dispatch_combine");
            pe.fail_at = 0;
            buf_make(f, &dy, 2, T, H, dt);
            buf_make(f, &dyr, 2, rows, H, dt);
            arm(f, &pe);
            st = moe_dispatch_combine_backward(h, &dy.t, &dyr.t, NULL, NULL);
            after(&pe, st, "moe_dispatch_combine_backward");
            fz_check_message(ctx, st, "moe_dispatch_combine_backward");
            pe.fail_at = 0;
            buf_make(f, &dxr, 2, rows, H, dt);
            buf_make(f, &dx, 2, T, H, dt);
            arm(f, &pe);
            st = moe_dispatch_backward(h, &dxr.t, NULL, &dx.t, NULL, NULL);
            after(&pe, st, "moe_dispatch_backward");
            fz_check_message(ctx, st, "moe_dispatch_backward");
            pe.fail_at = 0;
            buf_free(&yr), buf_free(&y), buf_free(&dy), buf_free(&dyr), buf_free(&dxr), buf_free(&dx);
            moe_dispatch_destroy(h);
        }
        buf_free(&x), buf_free(&ix), buf_free(&pr);
    }
    moe_dispatcher_destroy(d);
    moe_comm_destroy(ep);
    FZ_CHECK(pe.released == 1, "hooks released %d times once the comm and the dispatcher were gone", pe.released);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    fz_alloc a;
    moe_context *ctx = fz_context(&a, (size_t)8 << 20);
    if (fz_u8(&f) & 1) run_dispatcher(&f, ctx);
    else run_layer(&f, ctx);
    fz_context_done(ctx, &a);
    return 0;
}

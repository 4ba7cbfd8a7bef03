/*
 * fuzz_dispatcher: routing inputs into the standalone token dispatcher (moe_dispatcher_*,
 * moe_dispatch_*). One input = a small dispatcher (either kind, any dtype, H <= 16, E <= 8, capacity
 * with or without padding, weighted or unweighted combine; one rank, or a self comm), one or two
 * dispatches of fuzzed routing decisions, then the handle's calls in any order with fuzzed
 * descriptors, sometimes with an injected allocation failure.
 *
 * Routing inputs: expert indices valid (distinct per token, in [0, E)), out of range (negative,
 * = E, huge), repeated within a token, or raw bits, as int32 or int64; probabilities NULL, random,
 * or with NaN / Inf; T from 0 up, odd shapes. Descriptors follow fuzz_common.h.
 *
 * Checks beyond "no crash, no undefined behaviour, no leak": indices out of range or repeated are
 * refused (the ABI requires distinct ids in [0, E)); documented-invalid descriptors are refused; a
 * failed call leaves its output tensors as they were; combine_backward before a combine is
 * MOE_ERR_STATE; the reported row counts agree (info's Rx = the sum of tokens_per_expert); every
 * failure's message begins with its status.
 */
#include "fuzz_common.h"

typedef struct world {
    fz_alloc alloc;
    moe_context *ctx;
    moe_comm *self;
    moe_dispatcher *d;
    moe_dispatcher_config cfg;
    DLDataType dt;
    int32_t E_local;
} world;

static fz_spec spec_rows(const world *w, int64_t rows, int32_t cols)
{
    fz_spec s;
    memset(&s, 0, sizeof s);
    s.ndim = cols > 0 ? 2 : 1;
    s.shape[0] = rows;
    s.shape[1] = cols;
    s.fixed = cols > 0 ? 3u : 1u;
    s.dtype[0] = w->dt;
    s.ndtypes = 1;
    return s;
}

/* The sizes a handle's calls expect, and the sizes the harness builds with (another handle's, now
 * and then: plausible wrong shapes). */
typedef struct sizes {
    int64_t T, Rx;       /* the handle's */
    int64_t bT, bRx;     /* to build with */
} sizes;

static fz_spec spec_of(const world *w, const sizes *z, int which_rows, int32_t cols)
{
    fz_spec s = spec_rows(w, which_rows ? z->Rx : z->T, cols);
    s.has_build = 1;
    s.build[0] = which_rows ? z->bRx : z->bT;
    s.build[1] = cols;
    return s;
}

/* Writes routing indices into a real [T, K] int32 / int64 tensor; returns 1 if every row holds K
 * distinct ids in [0, E). */
static int fill_indices(fz *f, fz_tensor *ix, int64_t T, int32_t K, int32_t E)
{
    if (!ix->real || ix->elem == 0) return 1;
    const int is32 = ix->t.dtype.bits == 32;
    const uint8_t mode = fz_u8(f);
    int valid = 1;
    const int64_t *st = ix->t.strides;
    for (int64_t t = 0; t < T; t++) {
        uint8_t used[64] = {0};
        int32_t start = (int32_t)fz_range(f, 0, E - 1);
        for (int32_t k = 0; k < K; k++) {
            int64_t e;
            if (mode < 160) e = (start + k) % E; /* distinct */
            else if (mode < 200) e = fz_range(f, -2, E + 1);
            else if (mode < 232) e = fz_range(f, 0, E - 1);
            else e = fz_u8(f) < 128 ? fz_odd(f) : (int64_t)fz_u64(f);
            if (is32) e = (int32_t)e; /* what the tensor holds */
            if (e < 0 || e >= E || used[e]) valid = 0;
            else used[e] = 1;
            int64_t at = st ? t * st[0] + k * st[1] : t * K + k;
            char *p = ix->first + at * ix->elem;
            if (is32) {
                int32_t v = (int32_t)e;
                memcpy(p, &v, 4);
            } else {
                memcpy(p, &e, 8);
            }
        }
    }
    return valid;
}

static moe_dispatch *do_dispatch(fz *f, world *w, int64_t *T_out)
{
    const int32_t K = w->cfg.top_k, E = w->cfg.num_experts;
    uint8_t tm = fz_u8(f);
    int64_t T = tm < 200 ? fz_range(f, 0, 8) : tm < 240 ? fz_range(f, 0, 64) : fz_odd(f);
    fz_spec sx = spec_rows(w, T, (int32_t)w->cfg.hidden);
    sx.fixed = 2u;
    fz_tensor x, ix, pr;
    fz_tensor_make(f, &sx, &x);
    const int64_t Tx = (x.t.ndim >= 1 && x.t.shape) ? x.t.shape[0] : T;
    fz_spec si;
    memset(&si, 0, sizeof si);
    si.ndim = 2, si.shape[0] = Tx, si.shape[1] = K, si.fixed = 3u;
    si.dtype[0] = fz_dl(kDLInt, 32), si.dtype[1] = fz_dl(kDLInt, 64), si.ndtypes = 2;
    si.pick_dtype = fz_u8(f) & 1;
    fz_tensor_make(f, &si, &ix);
    int idx_valid = 1;
    if (!ix.invalid && ix.real && Tx >= 0 && Tx <= 4096) idx_valid = fill_indices(f, &ix, Tx, K, E);
    const int with_probs = fz_u8(f) < 192;
    fz_spec sp = spec_rows(w, Tx, K);
    if (with_probs) fz_tensor_make(f, &sp, &pr);
    moe_dispatch *h = (moe_dispatch *)(uintptr_t)0x10;
    int32_t st = moe_dispatcher_dispatch(w->d, &x.t, &ix.t, with_probs ? &pr.t : NULL, &h, NULL);
    fz_check_message(w->ctx, st, "moe_dispatcher_dispatch");
    fz_expect_refused(&x, st, "moe_dispatcher_dispatch", "x");
    fz_expect_refused(&ix, st, "moe_dispatcher_dispatch", "indices");
    if (with_probs) fz_expect_refused(&pr, st, "moe_dispatcher_dispatch", "probs");
    if (!x.invalid && !ix.invalid)
        FZ_CHECK(idx_valid || st != MOE_OK, "moe_dispatcher_dispatch accepted expert ids out of [0, %d) or repeated", E);
    fz_tensor_free(&x);
    fz_tensor_free(&ix);
    if (with_probs) fz_tensor_free(&pr);
    if (st != MOE_OK) {
        FZ_CHECK(h == (moe_dispatch *)(uintptr_t)0x10, "a failed dispatch wrote *out");
        return NULL;
    }
    *T_out = Tx;
    return h;
}

static void op_rows(fz *f, world *w, moe_dispatch *h, const sizes *z)
{
    fz_spec sxr = spec_of(w, z, 1, (int32_t)w->cfg.hidden), spr = spec_of(w, z, 1, 0);
    fz_spec sc;
    memset(&sc, 0, sizeof sc);
    sc.ndim = 1, sc.shape[0] = w->E_local, sc.fixed = 1u, sc.dtype[0] = fz_dl(kDLInt, 64), sc.ndtypes = 1;
    const uint8_t which = fz_u8(f); /* bit set: pass that output */
    fz_tensor xr, prr, cnt;
    fz_tensor_make(f, &sxr, &xr);
    fz_tensor_make(f, &spr, &prr);
    fz_tensor_make(f, &sc, &cnt);
    fz_snap s1, s2, s3;
    fz_snap_take(&s1, &xr);
    fz_snap_take(&s2, &prr);
    fz_snap_take(&s3, &cnt);
    int32_t st = moe_dispatch_rows(h, (which & 1) ? &xr.t : NULL, (which & 2) ? &prr.t : NULL, (which & 4) ? &cnt.t : NULL);
    fz_check_message(w->ctx, st, "moe_dispatch_rows");
    if (which & 1) fz_expect_refused(&xr, st, "moe_dispatch_rows", "x_rows");
    if (which & 2) fz_expect_refused(&prr, st, "moe_dispatch_rows", "row_probs");
    if (which & 4) fz_expect_refused(&cnt, st, "moe_dispatch_rows", "tokens_per_expert");
    fz_snap_check(&s1, &xr, st, "moe_dispatch_rows", "x_rows");
    fz_snap_check(&s2, &prr, st, "moe_dispatch_rows", "row_probs");
    fz_snap_check(&s3, &cnt, st, "moe_dispatch_rows", "tokens_per_expert");
    if (st == MOE_OK && (which & 4) && cnt.real && cnt.elem == 8) {
        int64_t sum = 0;
        for (int32_t j = 0; j < w->E_local; j++) {
            int64_t v;
            int64_t at = cnt.t.strides ? j * cnt.t.strides[0] : j;
            memcpy(&v, cnt.first + at * 8, 8);
            FZ_CHECK(v >= 0, "tokens_per_expert[%d] = %lld", j, (long long)v);
            sum += v;
        }
        FZ_CHECK(sum == z->Rx, "tokens_per_expert sums to %lld, info says %lld rows", (long long)sum, (long long)z->Rx);
    }
    fz_tensor_free(&xr);
    fz_tensor_free(&prr);
    fz_tensor_free(&cnt);
}

static int op_combine(fz *f, world *w, moe_dispatch *h, const sizes *z)
{
    fz_spec syr = spec_of(w, z, 1, (int32_t)w->cfg.hidden), sy = spec_of(w, z, 0, (int32_t)w->cfg.hidden);
    fz_tensor yr, y;
    fz_tensor_make(f, &syr, &yr);
    fz_tensor_make(f, &sy, &y);
    fz_snap s;
    fz_snap_take(&s, &y);
    int32_t st = moe_dispatch_combine(h, &yr.t, &y.t, NULL);
    fz_check_message(w->ctx, st, "moe_dispatch_combine");
    fz_expect_refused(&yr, st, "moe_dispatch_combine", "y_rows");
    fz_expect_refused(&y, st, "moe_dispatch_combine", "y");
    fz_snap_check(&s, &y, st, "moe_dispatch_combine", "y");
    fz_tensor_free(&yr);
    fz_tensor_free(&y);
    return st == MOE_OK;
}

static void op_combine_backward(fz *f, world *w, moe_dispatch *h, const sizes *z, int combined)
{
    fz_spec sdy = spec_of(w, z, 0, (int32_t)w->cfg.hidden), sdr = spec_of(w, z, 1, (int32_t)w->cfg.hidden),
            sdp = spec_of(w, z, 1, 0);
    fz_tensor dy, dr, dp;
    fz_tensor_make(f, &sdy, &dy);
    fz_tensor_make(f, &sdr, &dr);
    fz_tensor_make(f, &sdp, &dp);
    const int with_dp = fz_bit(f);
    fz_snap s1, s2;
    fz_snap_take(&s1, &dr);
    fz_snap_take(&s2, &dp);
    int32_t st = moe_dispatch_combine_backward(h, &dy.t, &dr.t, with_dp ? &dp.t : NULL, NULL);
    fz_check_message(w->ctx, st, "moe_dispatch_combine_backward");
    if (!combined) FZ_CHECK(st == MOE_ERR_STATE, "combine_backward before any combine: %d", st);
    fz_expect_refused(&dy, st, "moe_dispatch_combine_backward", "dy");
    fz_expect_refused(&dr, st, "moe_dispatch_combine_backward", "dy_rows");
    if (with_dp) fz_expect_refused(&dp, st, "moe_dispatch_combine_backward", "d_row_probs");
    fz_snap_check(&s1, &dr, st, "moe_dispatch_combine_backward", "dy_rows");
    fz_snap_check(&s2, &dp, st, "moe_dispatch_combine_backward", "d_row_probs");
    fz_tensor_free(&dy);
    fz_tensor_free(&dr);
    fz_tensor_free(&dp);
}

static void op_backward(fz *f, world *w, moe_dispatch *h, const sizes *z)
{
    fz_spec sxr = spec_of(w, z, 1, (int32_t)w->cfg.hidden), sdp = spec_of(w, z, 1, 0),
            sdx = spec_of(w, z, 0, (int32_t)w->cfg.hidden), sdpr = spec_of(w, z, 0, w->cfg.top_k);
    fz_tensor dxr, dp, dx, dpr;
    fz_tensor_make(f, &sxr, &dxr);
    fz_tensor_make(f, &sdp, &dp);
    fz_tensor_make(f, &sdx, &dx);
    fz_tensor_make(f, &sdpr, &dpr);
    const uint8_t which = fz_u8(f);
    fz_snap s1, s2;
    fz_snap_take(&s1, &dx);
    fz_snap_take(&s2, &dpr);
    int32_t st = moe_dispatch_backward(h, &dxr.t, (which & 1) ? &dp.t : NULL, &dx.t, (which & 2) ? &dpr.t : NULL, NULL);
    fz_check_message(w->ctx, st, "moe_dispatch_backward");
    fz_expect_refused(&dxr, st, "moe_dispatch_backward", "dx_rows");
    if (which & 1) fz_expect_refused(&dp, st, "moe_dispatch_backward", "d_row_probs");
    fz_expect_refused(&dx, st, "moe_dispatch_backward", "dx");
    if (which & 2) fz_expect_refused(&dpr, st, "moe_dispatch_backward", "dprobs");
    fz_snap_check(&s1, &dx, st, "moe_dispatch_backward", "dx");
    fz_snap_check(&s2, &dpr, st, "moe_dispatch_backward", "dprobs");
    fz_tensor_free(&dxr);
    fz_tensor_free(&dp);
    fz_tensor_free(&dx);
    fz_tensor_free(&dpr);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    world w;
    memset(&w, 0, sizeof w);
    w.ctx = fz_context(&w.alloc, (size_t)8 << 20);
    moe_dispatcher_config_init(&w.cfg, sizeof w.cfg);
    static const double caps[] = {0, 1, 1.25, 0.5, 2, 0.01};
    w.cfg.kind = (int32_t)fz_range(&f, 0, 1);
    w.cfg.dtype = (int32_t)fz_range(&f, 0, 2);
    w.cfg.hidden = fz_range(&f, 1, 16);
    w.cfg.num_experts = (int32_t)fz_range(&f, 1, 8);
    w.cfg.top_k = (int32_t)fz_range(&f, 1, w.cfg.num_experts);
    w.cfg.capacity_factor = caps[fz_u8(&f) % 6];
    w.cfg.drop_policy = (int32_t)fz_range(&f, 0, 1);
    w.cfg.pad_to_capacity = w.cfg.capacity_factor > 0 ? (int32_t)fz_range(&f, 0, 1) : 0;
    w.cfg.combine = (int32_t)fz_range(&f, 0, 1);
    moe_comm *ep = NULL;
    if (fz_u8(&f) >= 192) {
        FZ_CHECK(moe_comm_create_self(w.ctx, NULL, &w.self) == MOE_OK, "moe_comm_create_self");
        ep = w.self;
    }
    int32_t st = moe_dispatcher_create(w.ctx, &w.cfg, ep, &w.d);
    fz_check_message(w.ctx, st, "moe_dispatcher_create");
    FZ_CHECK(st == MOE_OK, "moe_dispatcher_create of a valid config: %d", st);
    int32_t first = -1;
    FZ_CHECK(moe_dispatcher_local_experts(w.d, &w.E_local, &first) == MOE_OK, "moe_dispatcher_local_experts");
    w.dt = fz_dl_of(w.cfg.dtype);

    moe_dispatch *hs[2] = {NULL, NULL};
    int64_t T[2] = {0, 0}, Rx[2] = {0, 0};
    int combined[2] = {0, 0};
    for (int op = 0; op < 10 && f.n > 0; op++) {
        uint8_t code = fz_u8(&f);
        if (code >= 248) w.alloc.fail_after = (int32_t)fz_range(&f, 1, 24);
        int i = (code >> 4) & 1;
        if (!hs[i] || (code & 7) == 0) {
            if (!w.d) continue;
            moe_dispatch *h = do_dispatch(&f, &w, &T[i]);
            if (h) {
                moe_dispatch_destroy(hs[i]);
                hs[i] = h;
                combined[i] = 0;
                int64_t dropped = -1, padded = -1;
                FZ_CHECK(moe_dispatch_info(h, &Rx[i], &dropped, &padded) == MOE_OK, "moe_dispatch_info");
                FZ_CHECK(Rx[i] >= 0 && dropped >= 0 && padded >= 0, "info: Rx %lld, dropped %lld, padded %lld",
                         (long long)Rx[i], (long long)dropped, (long long)padded);
                FZ_CHECK(moe_dispatch_info(h, NULL, NULL, NULL) == MOE_OK, "moe_dispatch_info(NULL...)");
            }
        } else {
            /* sizes of another handle now and then: wrong Rx / T for this one */
            sizes z = {T[i], Rx[i], (code & 8) ? T[i ^ 1] : T[i], (code & 8) ? Rx[i ^ 1] : Rx[i]};
            switch (code & 7) {
            case 1: op_rows(&f, &w, hs[i], &z); break;
            case 2:
            case 3: combined[i] |= op_combine(&f, &w, hs[i], &z); break;
            case 4: op_combine_backward(&f, &w, hs[i], &z, combined[i]); break;
            case 5: op_backward(&f, &w, hs[i], &z); break;
            case 6: /* the host drops the dispatcher; open handles keep it alive */
                moe_dispatcher_destroy(w.d);
                w.d = NULL;
                break;
            default: moe_dispatch_destroy(hs[i]), hs[i] = NULL; break;
            }
        }
        w.alloc.fail_after = 0;
    }
    moe_dispatch_destroy(hs[0]);
    moe_dispatch_destroy(hs[1]);
    moe_dispatcher_destroy(w.d);
    moe_comm_destroy(w.self);
    fz_context_done(w.ctx, &w.alloc);
    return 0;
}

/*
 * Kernels of the dispatch ops (docs/math.md §4-§5, contracts in src/backend/ops.h): dispatch_plan,
 * permute, unpermute, align_rows, gather_slots, ag_pack_routing, ag_expert_rows. fp32 table.
 *
 * Plans are stable bucket sorts of the assignments by expert, done with the device-wide radix sort
 * of kdevice.h (CUB on CUDA) instead of the CPU's serial counting sort:
 *  - keys = expert (an out-of-range expert goes to the extra bucket E, sorted last and never kept),
 *    values = assignment id a = t*K + k, in ascending a: the stable sort leaves every expert's
 *    assignments in ascending a, i.e. ascending token, as the plan's rows must be;
 *  - the segment [start[e], end[e]) of expert e in the sorted order gives its count, and an
 *    assignment's position j in its segment is its rank in the expert;
 *  - capacity, position policy: the j < C are kept, and j is the row within the expert;
 *  - capacity, probs policy: a second order (probability descending, ties -> earlier a, NaN last)
 *    per expert, made by two stable sorts (by a probability key, then by expert), decides who is
 *    kept (position < C there); the rows of the kept, in ascending a, come from a scan of the
 *    kept flags over the first order.
 * Every integer output is therefore exactly the CPU's (src/backend/cpu/cpu_dispatch.c,
 * cpu_plan_rows.c); nothing depends on thread timing (no atomics at all).
 *
 * Scratch: the sort keys live in an output of 8 bytes per assignment (dispatch_plan: slot_row,
 * ag_expert_rows: gslot; the two 4-byte key buffers) until the last kernel writes it; values,
 * expert segments and CUB's temporary storage are carved from ex->workspace, in bytes (N = T*K
 * assignments, slices 256-byte aligned):
 *   dispatch_plan   16 E + 8 (N + 1), + 4 (N + 1) for the probs policy with a capacity, + CUB's
 *                   (onesweep radix sort: about 1 KiB per tile of a few thousand items)
 *   ag_expert_rows  16 El + 8 N + CUB's
 * and a launcher fails with MOE_ERR_OUT_OF_MEMORY naming the need when it does not fit.
 *
 * Data the host cannot see (ops.h "Statuses"): dispatch_plan's expert ids, align_rows' plan
 * offsets, ag_expert_rows' gathered experts and block offsets live in device memory, so the
 * launchers cannot return the CPU's status for inconsistent values; the kernels instead never write
 * outside the outputs' bounds: an out-of-range expert id is dropped (dispatch_plan) or ignored
 * (ag_expert_rows), rows past a block's end or past the outputs' size are not written, and an
 * output pointer that is NULL where the CPU would check the data is not written.
 */
#include <type_traits>

#include "kdevice.h"

/* "#pragma unroll" for nvcc only (the host compiler warns about it) */
#ifdef __CUDACC__
#define UNROLL4 _Pragma("unroll 4")
#else
#define UNROLL4
#endif

namespace MOE_KNS {

/* ---- helpers ------------------------------------------------------------------------------------ */

/* Exclusive prefix sum of v over the block (threads in order), deterministic; *total gets the
 * block's sum. blockDim.x a multiple of 32, at most 1024; every thread must call it. */
static __device__ int64_t block_exclusive_scan(int64_t v, int64_t *total)
{
    __shared__ int64_t warp_incl[32];
    __shared__ int64_t sum;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int64_t x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int64_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_incl[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int64_t w = lane < warps ? warp_incl[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int64_t y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        warp_incl[lane] = w;
        if (lane == 31) sum = w;
    }
    __syncthreads();
    const int64_t r = (warp ? warp_incl[warp - 1] : 0) + x - v;
    *total = sum;
    __syncthreads(); /* the shared words may be reused by the next call */
    return r;
}

/* Little-endian 4-byte load from any address (record fields need not be aligned). */
__device__ __forceinline__ uint32_t load_u32_any(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Bits for bucket keys 0..nb (nb itself the extra bucket). */
static int key_bits(int64_t nb)
{
    int b = 1;
    while (b < 32 && ((int64_t)1 << b) <= nb) b++;
    return b;
}

/* Sub-allocation of ex->workspace: 256-byte aligned slices. With base NULL it only measures. */
struct carver {
    char *base;
    size_t used;
    void *take(size_t bytes)
    {
        const size_t off = (used + 255) & ~(size_t)255;
        used = off + bytes;
        return base ? base + off : nullptr;
    }
};

/* seg[0, n) = 0 (the expert segments start empty: experts without assignments keep them). */
__global__ void zero_i64_kernel(int64_t n, int64_t *seg)
{
    for (int64_t i = gtid(); i < n; i += gstride()) seg[i] = 0;
}

/* Segment bounds of the sorted bucket keys: start[e] / end[e] for the buckets e < nb present. */
__global__ void segment_bounds_kernel(int64_t n, uint32_t nb, const uint32_t *keys, int64_t *start, int64_t *end)
{
    for (int64_t i = gtid(); i < n; i += gstride()) {
        const uint32_t e = keys[i];
        if (e >= nb) continue;
        if (i == 0 || keys[i - 1] != e) start[e] = i;
        if (i == n - 1 || keys[i + 1] != e) end[e] = i + 1;
    }
}

/* ---- dispatch_plan ------------------------------------------------------------------------------ */

__device__ __forceinline__ bool expert_ok(int32_t e, int32_t E) { return e >= 0 && e < E; }

/* keys[a] = expert of a (E when out of range), vals[a] = a. */
__global__ void plan_init_kernel(int64_t TK, int32_t E, const int32_t *idx, uint32_t *keys, int32_t *vals)
{
    for (int64_t a = gtid(); a < TK; a += gstride()) {
        const int32_t e = idx[a];
        keys[a] = expert_ok(e, E) ? (uint32_t)e : (uint32_t)E;
        vals[a] = (int32_t)a;
    }
}

/* The probs policy's order as an unsigned key, larger = kept first: the float's order for non-NaN
 * values (-0 = +0), NaN below everything (the CPU sorts NaN last). */
__device__ __forceinline__ uint32_t prob_key(float p)
{
    if (p != p) return 0;
    const uint32_t b = p == 0.0f ? 0u : (uint32_t)__float_as_int(p);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__global__ void prob_key_kernel(int64_t TK, const float *p, uint32_t *keys, int32_t *vals)
{
    for (int64_t a = gtid(); a < TK; a += gstride()) {
        keys[a] = prob_key(p[a]);
        vals[a] = (int32_t)a;
    }
}

/* keys[i] = expert of order[i] (E when out of range). */
__global__ void expert_key_kernel(int64_t TK, int32_t E, const int32_t *idx, const int32_t *order, uint32_t *keys)
{
    for (int64_t i = gtid(); i < TK; i += gstride()) {
        const int32_t e = idx[order[i]];
        keys[i] = expert_ok(e, E) ? (uint32_t)e : (uint32_t)E;
    }
}

/* order = by expert, then probability descending, then a: the first C of an expert are kept.
 * dropped[a] = 1 for the others (and for out-of-range experts). */
__global__ void keep_by_prob_kernel(int64_t TK, int32_t E, int64_t C, const int32_t *idx, const int32_t *order,
                                    const int64_t *start, uint8_t *dropped)
{
    for (int64_t i = gtid(); i < TK; i += gstride()) {
        const int32_t a = order[i], e = idx[a];
        dropped[a] = !expert_ok(e, E) || i - start[e] >= C;
    }
}

/* flag[i] = 1 when assignment order[i] is kept. */
__global__ void kept_flag_kernel(int64_t TK, const int32_t *order, const uint8_t *dropped, int32_t *flag)
{
    for (int64_t i = gtid(); i < TK; i += gstride()) flag[i] = !dropped[order[i]];
}

/* One block: per-expert counts, kept counts, row offsets (padded: C rows each) and the stats. */
__global__ void plan_experts_kernel(int32_t E, int64_t TK, int64_t C, int dropless, int padded, const int64_t *start,
                                    const int64_t *end, int64_t *tokens_per_expert, int64_t *kept_per_expert,
                                    int64_t *off, int64_t *stats)
{
    int64_t rows = 0, kept_total = 0, pad_total = 0;
    for (int64_t base = 0; base < E; base += blockDim.x) {
        const int64_t e = base + threadIdx.x;
        int64_t n = 0, ke = 0, re = 0;
        if (e < E) {
            n = end[e] - start[e];
            ke = dropless || n <= C ? n : C;
            re = padded ? C : ke;
        }
        int64_t total;
        const int64_t before = block_exclusive_scan(re, &total);
        if (e < E) {
            tokens_per_expert[e] = n;
            kept_per_expert[e] = ke;
            off[e] = rows + before;
        }
        rows += total;
        kept_total += block_sum(ke);
        pad_total += block_sum(re - ke);
    }
    if (threadIdx.x == 0) {
        off[E] = rows;
        stats[0] = rows;
        stats[1] = TK - kept_total;
        stats[2] = pad_total;
    }
}

/* The final layout, per assignment in the expert order: its row (or -1), the row's token and
 * probability. by_prob: kept = !dropped[a] and the row within the expert = kept ones before it
 * (scan[i] - scan[start[e]]); otherwise the first kept_per_expert[e] of the segment are kept. */
__global__ void plan_scatter_kernel(int64_t TK, int32_t K, int32_t E, int by_prob, const int32_t *idx, const float *p,
                                    const int32_t *order, const int64_t *start, const int64_t *kept,
                                    const int64_t *off, const int32_t *scan, int64_t *row_token, float *row_prob,
                                    int64_t *slot_row, uint8_t *dropped)
{
    for (int64_t i = gtid(); i < TK; i += gstride()) {
        const int32_t a = order[i], e = idx[a];
        int64_t row = -1;
        if (expert_ok(e, E)) {
            const int64_t s = start[e], j = i - s;
            if (by_prob) {
                if (!dropped[a]) row = off[e] + (int64_t)(scan[i] - scan[s]);
            } else if (j < kept[e]) {
                row = off[e] + j;
            }
        }
        slot_row[a] = row;
        dropped[a] = row < 0;
        if (row >= 0) {
            row_token[row] = a / K;
            row_prob[row] = p[a];
        }
    }
}

/* Padded plans: rows [kept_e, C) of every expert's C rows are padding (token -1, p = 0). */
__global__ void plan_pad_kernel(int64_t EC, int64_t C, const int64_t *kept, int64_t *row_token, float *row_prob)
{
    for (int64_t r = gtid(); r < EC; r += gstride()) {
        const int64_t e = r / C;
        if (r - e * C >= kept[e]) {
            row_token[r] = -1;
            row_prob[r] = 0.0f;
        }
    }
}

/* The workspace of dispatch_plan: segments [2E] int64, value buffers [TK + 1] int32 (two; three
 * for the probs policy with a capacity), and the largest temporary storage of its CUB calls. */
struct plan_ws {
    int64_t *seg;
    int32_t *v[3];
    void *temp;
    size_t temp_bytes;
};

static int32_t plan_workspace(const moe_exec *ex, int32_t E, int64_t TK, int by_prob, int bits, plan_ws *w)
{
    size_t temp = 0;
    if (TK > 0) {
        uint32_t *nk[2] = {nullptr, nullptr};
        int32_t *nv[2] = {nullptr, nullptr};
        size_t b = 0;
        int32_t st = dev_sort_pairs_u32(ex, nullptr, &b, nk, nv, TK, 0, bits, 0, nullptr);
        if (st != MOE_OK) return st;
        temp = b;
        if (by_prob) {
            if ((st = dev_sort_pairs_u32(ex, nullptr, &b, nk, nv, TK, 0, 32, 1, nullptr)) != MOE_OK) return st;
            temp = b > temp ? b : temp;
            if ((st = dev_exclusive_scan_i32(ex, nullptr, &b, nullptr, nullptr, TK)) != MOE_OK) return st;
            temp = b > temp ? b : temp;
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        carver c = {pass ? (char *)ex->workspace : nullptr, 0};
        w->seg = (int64_t *)c.take(sizeof(int64_t) * 2 * (size_t)E);
        w->v[0] = w->v[1] = w->v[2] = nullptr;
        if (TK > 0)
            for (int i = 0; i < (by_prob ? 3 : 2); i++) w->v[i] = (int32_t *)c.take(sizeof(int32_t) * (size_t)(TK + 1));
        w->temp = c.take(temp);
        w->temp_bytes = temp;
        if (pass == 0 && c.used > ex->workspace_bytes)
            return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY,
                              "dispatch_plan over %lld assignments and %d experts needs %zu bytes of workspace, the "
                              "context has %zu",
                              (long long)TK, (int)E, c.used, ex->workspace_bytes);
    }
    return MOE_OK;
}

static int32_t dispatch_plan(const moe_exec *ex, int32_t E, int32_t K, int64_t T, const int32_t *idx,
                             const void *probs, int64_t capacity, int32_t drop_policy, int32_t pad,
                             moe_dispatch_plan *plan)
{
    const int32_t BAD = MOE_ERR_INVALID_ARGUMENT;
    if (ex == NULL || plan == NULL) return moe_errorf(NULL, BAD, "dispatch_plan: ex = %p, plan = %p", (const void *)ex,
                                                      (const void *)plan);
    if (E < 1 || K < 1 || T < 0 || (pad != 0 && pad != 1))
        return moe_errorf(NULL, BAD, "dispatch_plan: E = %d, K = %d, T = %lld, pad = %d", (int)E, (int)K,
                          (long long)T, (int)pad);
    if (drop_policy != MOE_DROP_PROBS && drop_policy != MOE_DROP_POSITION)
        return moe_errorf(NULL, BAD, "dispatch_plan: drop_policy = %d", (int)drop_policy);
    if (T > INT64_MAX / K) return moe_errorf(NULL, BAD, "dispatch_plan: T*K overflows (T = %lld, K = %d)",
                                             (long long)T, (int)K);
    const int64_t TK = T * K;
    const int dropless = capacity < 0;
    if (!dropless && capacity > INT64_MAX / E)
        return moe_errorf(NULL, BAD, "dispatch_plan: E*capacity overflows (capacity = %lld)", (long long)capacity);
    const int padded = !dropless && pad;
    const int64_t C = capacity, EC = dropless ? 0 : (int64_t)E * capacity;
    const int64_t R_max = dropless ? TK : padded ? EC : (TK < EC ? TK : EC);
    if (plan->tokens_per_expert == NULL || plan->kept_per_expert == NULL || plan->expert_offsets == NULL ||
        plan->stats == NULL)
        return moe_errorf(NULL, BAD, "dispatch_plan: a per-expert buffer or stats of the plan is NULL");
    if (TK > 0 && (idx == NULL || probs == NULL || plan->slot_row == NULL || plan->dropped == NULL))
        return moe_errorf(NULL, BAD, "dispatch_plan: idx, probs, slot_row or dropped is NULL with T*K = %lld",
                          (long long)TK);
    if (R_max > 0 && (plan->row_token == NULL || plan->row_prob == NULL))
        return moe_errorf(NULL, BAD, "dispatch_plan: row_token or row_prob is NULL with R_max = %lld",
                          (long long)R_max);
    if (TK > INT32_MAX)
        return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "dispatch_plan: %lld assignments, at most 2^31 - 1 fit the "
                          "device sort", (long long)TK);
    /* expert ids are device data: out-of-range ones are dropped here (the CPU rejects them) */

    const int by_prob = !dropless && drop_policy == MOE_DROP_PROBS;
    const int bits = key_bits(E);
    plan_ws w;
    int32_t st = plan_workspace(ex, E, TK, by_prob, bits, &w);
    if (st != MOE_OK) return st;
    int64_t *start = w.seg, *end = w.seg + E;
    const float *p = (const float *)probs;
    int32_t *order = nullptr, *scan = nullptr;

    if ((st = MOE_LAUNCH(zero_i64_kernel, grid_for(2 * (int64_t)E), THREADS, ex->stream, 2 * (int64_t)E, w.seg)))
        return st;
    if (TK > 0) {
        uint32_t *const keys[2] = {(uint32_t *)plan->slot_row, (uint32_t *)plan->slot_row + TK};
        const unsigned g = grid_for(TK);
        /* 1. the expert order: stable sort of a by expert */
        if ((st = MOE_LAUNCH(plan_init_kernel, g, THREADS, ex->stream, TK, E, idx, keys[0], w.v[0]))) return st;
        int sel = 0;
        {
            int32_t *const vals[2] = {w.v[0], w.v[1]};
            st = dev_sort_pairs_u32(ex, w.temp, &w.temp_bytes, keys, vals, TK, 0, bits, 0, &sel);
            if (st != MOE_OK) return st;
        }
        order = w.v[sel];
        if ((st = MOE_LAUNCH(segment_bounds_kernel, g, THREADS, ex->stream, TK, (uint32_t)E, keys[sel], start, end)))
            return st;
        if (by_prob) {
            /* 2. who is kept: the expert order again, by probability within an expert (two stable
             *    sorts from ascending a: by probability key descending, then by expert) */
            int32_t *const va[2] = {w.v[1 - sel], w.v[2]};
            if ((st = MOE_LAUNCH(prob_key_kernel, g, THREADS, ex->stream, TK, p, keys[0], va[0]))) return st;
            int s2 = 0, s3 = 0;
            if ((st = dev_sort_pairs_u32(ex, w.temp, &w.temp_bytes, keys, va, TK, 0, 32, 1, &s2)) != MOE_OK) return st;
            int32_t *const vb[2] = {va[s2], va[1 - s2]};
            if ((st = MOE_LAUNCH(expert_key_kernel, g, THREADS, ex->stream, TK, E, idx, vb[0], keys[0]))) return st;
            if ((st = dev_sort_pairs_u32(ex, w.temp, &w.temp_bytes, keys, vb, TK, 0, bits, 0, &s3)) != MOE_OK) return st;
            if ((st = MOE_LAUNCH(keep_by_prob_kernel, g, THREADS, ex->stream, TK, E, C, idx, vb[s3], w.seg,
                                 plan->dropped)))
                return st;
            /* 3. rows of the kept in ascending a: a scan of the kept flags over the expert order */
            int32_t *flag = vb[1 - s3];
            scan = vb[s3];
            if ((st = MOE_LAUNCH(kept_flag_kernel, g, THREADS, ex->stream, TK, order, plan->dropped, flag))) return st;
            if ((st = dev_exclusive_scan_i32(ex, w.temp, &w.temp_bytes, flag, scan, TK)) != MOE_OK) return st;
        }
    }
    if ((st = MOE_LAUNCH(plan_experts_kernel, 1, THREADS, ex->stream, E, TK, C, dropless, padded, start, end,
                         plan->tokens_per_expert, plan->kept_per_expert, plan->expert_offsets, plan->stats)))
        return st;
    if (TK > 0 && (st = MOE_LAUNCH(plan_scatter_kernel, grid_for(TK), THREADS, ex->stream, TK, K, E, by_prob, idx, p,
                                   order, start, plan->kept_per_expert, plan->expert_offsets, scan, plan->row_token,
                                   (float *)plan->row_prob, plan->slot_row, plan->dropped)))
        return st;
    if (padded && EC > 0 &&
        (st = MOE_LAUNCH(plan_pad_kernel, grid_for(EC), THREADS, ex->stream, EC, C, plan->kept_per_expert,
                         plan->row_token, (float *)plan->row_prob)))
        return st;
    return MOE_OK;
}

/* ---- permute / unpermute / gather_slots ------------------------------------------------------- */

/* Rows per block of the row kernels: one warp per row. */
constexpr int ROW_WARPS = THREADS / 32;

static inline unsigned grid_rows(int64_t rows)
{
    int64_t b = (rows + ROW_WARPS - 1) / ROW_WARPS;
    if (b > 65536) b = 65536;
    return (unsigned)(b < 1 ? 1 : b);
}

__device__ __forceinline__ void set_zero(float &v) { v = 0.0f; }
__device__ __forceinline__ void set_zero(float4 &v) { v.x = v.y = v.z = v.w = 0.0f; }

__device__ __forceinline__ int64_t gwarp() { return gtid() >> 5; }
__device__ __forceinline__ int64_t gwarps() { return gstride() >> 5; }

/* xp[r, :] = x[row_token[r], :] or zeros; one warp per row, V floats per lane access (V = 4:
 * float4, H a multiple of 4 and both buffers 16-byte aligned). */
template <int V> __global__ void permute_kernel(int64_t R, int64_t H, const float *x, const int64_t *row_token, float *xp)
{
    typedef typename std::conditional<V == 4, float4, float>::type vec;
    const int lane = threadIdx.x & 31;
    const int64_t HV = H / V;
    for (int64_t r = gwarp(); r < R; r += gwarps()) {
        const int64_t t = row_token[r];
        vec *dst = (vec *)(xp + r * H);
        if (t >= 0) {
            const vec *src = (const vec *)(x + t * H);
UNROLL4
            for (int64_t c = lane; c < HV; c += 32) dst[c] = src[c];
        } else {
            vec z;
            set_zero(z);
UNROLL4
            for (int64_t c = lane; c < HV; c += 32) dst[c] = z;
        }
    }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static int32_t permute(const moe_exec *ex, int64_t R, int64_t H, const void *x, const int64_t *row_token, void *xp)
{
    if (ex == NULL || R < 0 || H < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "permute: ex = %p, R = %lld, H = %lld", (const void *)ex,
                          (long long)R, (long long)H);
    if (R == 0 || H == 0) return MOE_OK;
    if (x == NULL || row_token == NULL || xp == NULL)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "permute: x = %p, row_token = %p, xp = %p", x,
                          (const void *)row_token, xp);
    if (H % 4 == 0 && aligned16(x) && aligned16(xp))
        return MOE_LAUNCH(permute_kernel<4>, grid_rows(R), THREADS, ex->stream, R, H, (const float *)x, row_token,
                          (float *)xp);
    return MOE_LAUNCH(permute_kernel<1>, grid_rows(R), THREADS, ex->stream, R, H, (const float *)x, row_token,
                      (float *)xp);
}

__device__ __forceinline__ void add_to(float &a, float b) { a += b; }
__device__ __forceinline__ void add_to(float4 &a, const float4 &b)
{
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
}

/* y[t, :] (+)= sum over k in order of rows[slot_row[t*K+k], :] (slots >= 0), the sum formed from
 * +0 first as on the CPU. One warp per token, V floats per lane access; a lane keeps U accesses
 * of one column tile (32 * U * V columns) in registers, so every slot is read once per tile and the
 * U loads of a row are in flight together. */
template <int V>
__global__ void unpermute_kernel(int64_t T, int32_t K, int64_t H, const float *rows, const int64_t *slot_row,
                                 int accumulate, float *y)
{
    typedef typename std::conditional<V == 4, float4, float>::type vec;
    constexpr int U = 4;
    const int lane = threadIdx.x & 31;
    const int64_t HV = H / V;
    const vec *src = (const vec *)rows;
    for (int64_t t = gwarp(); t < T; t += gwarps()) {
        const int64_t *slots = slot_row + t * K;
        vec *dst = (vec *)(y + t * H);
        for (int64_t c0 = lane; c0 < HV; c0 += 32 * U) {
            vec acc[U];
            for (int u = 0; u < U; u++) set_zero(acc[u]);
            for (int32_t k = 0; k < K; k++) {
                const int64_t r = slots[k];
                if (r < 0) continue;
                const vec *row = src + r * HV;
                for (int u = 0; u < U; u++)
                    if (c0 + 32 * u < HV) add_to(acc[u], row[c0 + 32 * u]);
            }
            for (int u = 0; u < U; u++) {
                const int64_t c = c0 + 32 * u;
                if (c >= HV) break;
                if (accumulate) {
                    vec o = dst[c];
                    add_to(o, acc[u]);
                    dst[c] = o;
                } else {
                    dst[c] = acc[u];
                }
            }
        }
    }
}

static int32_t unpermute(const moe_exec *ex, int64_t T, int32_t K, int64_t H, const void *rows,
                         const int64_t *slot_row, int32_t accumulate, void *y)
{
    if (ex == NULL || T < 0 || K < 1 || H < 0 || (accumulate != 0 && accumulate != 1))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "unpermute: ex = %p, T = %lld, K = %d, H = %lld, "
                          "accumulate = %d", (const void *)ex, (long long)T, (int)K, (long long)H, (int)accumulate);
    if (T == 0 || H == 0) return MOE_OK;
    if (slot_row == NULL || y == NULL)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "unpermute: slot_row = %p, y = %p", (const void *)slot_row,
                          y);
    if (H % 4 == 0 && aligned16(rows) && aligned16(y))
        return MOE_LAUNCH(unpermute_kernel<4>, grid_rows(T), THREADS, ex->stream, T, K, H, (const float *)rows,
                          slot_row, accumulate, (float *)y);
    return MOE_LAUNCH(unpermute_kernel<1>, grid_rows(T), THREADS, ex->stream, T, K, H, (const float *)rows, slot_row,
                      accumulate, (float *)y);
}

__global__ void gather_slots_kernel(int64_t n, const int64_t *slot, const float *rows, float *out)
{
    for (int64_t i = gtid(); i < n; i += gstride()) {
        const int64_t s = slot[i];
        out[i] = s >= 0 ? rows[s] : 0.0f;
    }
}

static int32_t gather_slots(const moe_exec *ex, int64_t n, const int64_t *slot, const void *rows, void *out)
{
    if (ex == NULL || n < 0)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gather_slots: ex = %p, n = %lld", (const void *)ex,
                          (long long)n);
    if (n == 0) return MOE_OK;
    if (slot == NULL || out == NULL)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "gather_slots: slot = %p, out = %p", (const void *)slot, out);
    return MOE_LAUNCH(gather_slots_kernel, grid_for(n), THREADS, ex->stream, n, slot, (const float *)rows,
                      (float *)out);
}

/* ---- align_rows --------------------------------------------------------------------------------- */

/* The largest e in [0, E) with v[e] <= x (v non-decreasing; the CPU's search, step for step). */
__device__ __forceinline__ int32_t last_le(const int64_t *v, int32_t E, int64_t x)
{
    int32_t lo = 0, hi = E - 1;
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (v[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* One block: xoff = exclusive scan of the aligned block sizes. */
__global__ void align_xoff_kernel(int32_t E, const int64_t *offsets, int64_t align, int64_t fixed_rows, int64_t *xoff)
{
    int64_t run = 0;
    for (int64_t base = 0; base < E; base += blockDim.x) {
        const int64_t e = base + threadIdx.x;
        int64_t sz = 0;
        if (e < E) {
            const int64_t blk = fixed_rows >= 0 ? fixed_rows : offsets[e + 1] - offsets[e];
            sz = (blk + align - 1) / align * align;
        }
        int64_t total;
        const int64_t before = block_exclusive_scan(sz, &total);
        if (e < E) xoff[e] = run + before;
        run += total;
    }
    if (threadIdx.x == 0) xoff[E] = run;
}

/* Aligned row a < min(xoff[E], rx_cap): plan row offsets[e] + j of its block's expert e, or padding. */
__global__ void align_rows_kernel(int64_t rx_cap, int32_t E, const int64_t *offsets, const int64_t *xoff,
                                  const int64_t *row_token, const float *row_prob, int64_t *row_token_al,
                                  float *row_prob_al)
{
    const int64_t Rx = xoff[E];
    for (int64_t a = gtid(); a < rx_cap && a < Rx; a += gstride()) {
        const int32_t e = last_le(xoff, E, a);
        const int64_t j = a - xoff[e], o = offsets[e];
        int64_t t = -1;
        float pv = 0.0f;
        if (j < offsets[e + 1] - o) {
            if (row_token) t = row_token[o + j];
            if (row_prob) pv = row_prob[o + j];
        }
        if (row_token_al) row_token_al[a] = t;
        if (row_prob_al) row_prob_al[a] = pv;
    }
}

__global__ void align_slots_kernel(int64_t TK, int32_t E, const int64_t *offsets, const int64_t *xoff,
                                   const int64_t *slot_row, int64_t *slot_row_al)
{
    for (int64_t i = gtid(); i < TK; i += gstride()) {
        const int64_t r = slot_row[i];
        if (r < 0) {
            slot_row_al[i] = -1;
            continue;
        }
        const int32_t e = last_le(offsets, E, r);
        slot_row_al[i] = xoff[e] + (r - offsets[e]);
    }
}

static int32_t align_rows(const moe_exec *ex, int32_t E, int64_t TK, const int64_t *offsets, const int64_t *row_token,
                          const void *row_prob, const int64_t *slot_row, int64_t align, int64_t fixed_rows,
                          int64_t rx_cap, int64_t *xoff, int64_t *row_token_al, void *row_prob_al,
                          int64_t *slot_row_al)
{
    const int32_t BAD = MOE_ERR_INVALID_ARGUMENT;
    if (ex == NULL || E < 1 || TK < 0 || align < 1 || rx_cap < 0 || offsets == NULL || xoff == NULL)
        return moe_errorf(NULL, BAD, "align_rows: ex = %p, E = %d, TK = %lld, align = %lld, rx_cap = %lld, "
                          "offsets = %p, xoff = %p", (const void *)ex, (int)E, (long long)TK, (long long)align,
                          (long long)rx_cap, (const void *)offsets, (const void *)xoff);
    /* fixed blocks are host values: the CPU's size checks, exactly (plan-sized blocks are device
     * data: the kernels stop at rx_cap instead) */
    if (fixed_rows >= 0) {
        if (fixed_rows > rx_cap)
            return moe_errorf(NULL, BAD, "align_rows: fixed_rows = %lld > rx_cap = %lld", (long long)fixed_rows,
                              (long long)rx_cap);
        const int64_t blk = (fixed_rows + align - 1) / align * align;
        if (blk > 0 && E > rx_cap / blk)
            return moe_errorf(NULL, BAD, "align_rows: %d blocks of %lld rows exceed rx_cap = %lld", (int)E,
                              (long long)blk, (long long)rx_cap);
    }
    if (TK > 0 && (slot_row == NULL || slot_row_al == NULL))
        return moe_errorf(NULL, BAD, "align_rows: slot_row = %p, slot_row_al = %p with TK = %lld",
                          (const void *)slot_row, (const void *)slot_row_al, (long long)TK);
    int32_t st = MOE_LAUNCH(align_xoff_kernel, 1, THREADS, ex->stream, E, offsets, align, fixed_rows, xoff);
    if (st) return st;
    if (rx_cap > 0 &&
        (st = MOE_LAUNCH(align_rows_kernel, grid_for(rx_cap), THREADS, ex->stream, rx_cap, E, offsets, xoff, row_token,
                         (const float *)row_prob, row_token_al, (float *)row_prob_al)))
        return st;
    if (TK > 0 && (st = MOE_LAUNCH(align_slots_kernel, grid_for(TK), THREADS, ex->stream, TK, E, offsets, xoff,
                                   slot_row, slot_row_al)))
        return st;
    return MOE_OK;
}

/* ---- all-gather routing records ------------------------------------------------------------------- */

/* Byte o of token t's record: K probabilities, K experts (-1 where dropped), zeros. W = 4: whole
 * 4-byte words (rrec a multiple of 4, rec aligned), W = 1: single bytes. */
template <int W>
__global__ void ag_pack_kernel(int64_t T, int32_t K, int64_t rrec, const float *probs, const int32_t *idx,
                               const int64_t *slot_row, unsigned char *rec)
{
    const int64_t per = rrec / W, n = T * per;
    for (int64_t i = gtid(); i < n; i += gstride()) {
        const int64_t t = i / per, o = (i - t * per) * W; /* byte offset in the record */
        uint32_t word = 0;
        if (o < 4 * (int64_t)K) {
            word = (uint32_t)__float_as_int(probs[t * K + o / 4]);
        } else if (o < 8 * (int64_t)K) {
            const int64_t a = t * K + (o - 4 * (int64_t)K) / 4;
            word = (uint32_t)(slot_row[a] >= 0 ? idx[a] : -1);
        }
        if (W == 4) {
            *(uint32_t *)(rec + t * rrec + o) = word;
        } else {
            rec[t * rrec + o] = (unsigned char)(word >> (8 * (o & 3)));
        }
    }
}

static int32_t ag_pack_routing(const moe_exec *ex, int64_t T, int32_t K, const void *probs, const int32_t *idx,
                               const int64_t *slot_row, int64_t rrec, void *rec)
{
    if (ex == NULL || T < 0 || K < 1 || rrec < (int64_t)((size_t)K * (sizeof(float) + 4)))
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "ag_pack_routing: ex = %p, T = %lld, K = %d, rrec = %lld",
                          (const void *)ex, (long long)T, (int)K, (long long)rrec);
    if (T == 0) return MOE_OK;
    if (probs == NULL || idx == NULL || slot_row == NULL || rec == NULL)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "ag_pack_routing: probs = %p, idx = %p, slot_row = %p, "
                          "rec = %p", probs, (const void *)idx, (const void *)slot_row, rec);
    if (rrec % 4 == 0 && ((uintptr_t)rec & 3) == 0)
        return MOE_LAUNCH(ag_pack_kernel<4>, grid_for(T * (rrec / 4)), THREADS, ex->stream, T, K, rrec,
                          (const float *)probs, idx, slot_row, (unsigned char *)rec);
    return MOE_LAUNCH(ag_pack_kernel<1>, grid_for(T * rrec), THREADS, ex->stream, T, K, rrec, (const float *)probs, idx,
                      slot_row, (unsigned char *)rec);
}

/* Local expert of gathered assignment a = g*K + k (El when it is not one of the El local ones). */
__device__ __forceinline__ uint32_t ag_local(const unsigned char *grec, int64_t rrec, int32_t K, int32_t first,
                                             int32_t El, int64_t a)
{
    const int64_t g = a / K, k = a - g * K;
    const int64_t e = (int64_t)(int32_t)load_u32_any(grec + g * rrec + 4 * (int64_t)K + 4 * k) - first;
    return e >= 0 && e < El ? (uint32_t)e : (uint32_t)El;
}

__global__ void ag_init_kernel(int64_t TK, int32_t K, int32_t first, int32_t El, int64_t rrec,
                               const unsigned char *grec, uint32_t *keys, int32_t *vals)
{
    for (int64_t a = gtid(); a < TK; a += gstride()) {
        keys[a] = ag_local(grec, rrec, K, first, El, a);
        vals[a] = (int32_t)a;
    }
}

/* Sorted position i: assignment order[i] of local expert e goes to row xoff[e] + (its rank), if
 * that row lies inside its block and inside the rows (else -1: a block too small, a device fault). */
__global__ void ag_scatter_kernel(int64_t TK, int32_t K, int32_t first, int32_t El, int64_t rrec,
                                  const unsigned char *grec, const int64_t *xoff, const int32_t *order,
                                  const int64_t *start, int64_t *gslot, int64_t *rowtok, float *pr)
{
    const int64_t Rx = xoff[El];
    for (int64_t i = gtid(); i < TK; i += gstride()) {
        const int64_t a = order[i];
        const uint32_t e = ag_local(grec, rrec, K, first, El, a);
        int64_t row = -1;
        if (e < (uint32_t)El) {
            const int64_t r = xoff[e] + (i - start[e]);
            if (r >= 0 && r < xoff[e + 1] && r < Rx) row = r;
        }
        gslot[a] = row;
        if (row >= 0) {
            const int64_t g = a / K;
            if (rowtok) rowtok[row] = g;
            if (pr) pr[row] = __int_as_float((int)load_u32_any(grec + g * rrec + 4 * (a - g * K)));
        }
    }
}

/* Padding of every local expert's block: rows [xoff[e] + n_e, xoff[e+1]) (within the rows). */
__global__ void ag_pad_kernel(int32_t El, const int64_t *xoff, const int64_t *start, const int64_t *end,
                              int64_t *rowtok, float *pr)
{
    const int64_t Rx = xoff[El];
    for (int64_t e = blockIdx.x; e < El; e += gridDim.x) {
        int64_t lo = xoff[e] + (end[e] - start[e]), hi = xoff[e + 1];
        if (lo < 0) lo = 0;
        if (hi > Rx) hi = Rx;
        for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
            if (rowtok) rowtok[r] = -1;
            if (pr) pr[r] = 0.0f;
        }
    }
}

static int32_t ag_expert_rows(const moe_exec *ex, int64_t T_all, int32_t K, int32_t E, int32_t first, int32_t El,
                              int64_t rrec, const void *grec, const int64_t *xoff, int64_t *gslot, int64_t *rowtok,
                              void *pr)
{
    const int32_t BAD = MOE_ERR_INVALID_ARGUMENT;
    if (ex == NULL || T_all < 0 || K < 1 || E < 1 || first < 0 || El < 1 || (int64_t)first + El > E || xoff == NULL ||
        rrec < (int64_t)((size_t)K * (sizeof(float) + 4)))
        return moe_errorf(NULL, BAD, "ag_expert_rows: ex = %p, T_all = %lld, K = %d, E = %d, first = %d, El = %d, "
                          "rrec = %lld, xoff = %p", (const void *)ex, (long long)T_all, (int)K, (int)E, (int)first,
                          (int)El, (long long)rrec, (const void *)xoff);
    if (T_all > 0 && (grec == NULL || gslot == NULL))
        return moe_errorf(NULL, BAD, "ag_expert_rows: grec = %p, gslot = %p with T_all = %lld", grec, (void *)gslot,
                          (long long)T_all);
    if (T_all > INT64_MAX / K) return moe_errorf(NULL, BAD, "ag_expert_rows: T_all*K overflows");
    const int64_t TK = T_all * K;
    if (TK > INT32_MAX)
        return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "ag_expert_rows: %lld assignments, at most 2^31 - 1 fit the "
                          "device sort", (long long)TK);
    /* xoff, Rx and the experts are device data: the kernels keep every write inside the blocks */
    const int bits = key_bits(El);
    size_t temp = 0;
    if (TK > 0) {
        uint32_t *nk[2] = {nullptr, nullptr};
        int32_t *nv[2] = {nullptr, nullptr};
        int32_t st = dev_sort_pairs_u32(ex, nullptr, &temp, nk, nv, TK, 0, bits, 0, nullptr);
        if (st != MOE_OK) return st;
    }
    int64_t *seg = nullptr;
    int32_t *v[2] = {nullptr, nullptr};
    void *tmp = nullptr;
    for (int pass = 0; pass < 2; pass++) {
        carver c = {pass ? (char *)ex->workspace : nullptr, 0};
        seg = (int64_t *)c.take(sizeof(int64_t) * 2 * (size_t)El);
        if (TK > 0)
            for (int i = 0; i < 2; i++) v[i] = (int32_t *)c.take(sizeof(int32_t) * (size_t)TK);
        tmp = c.take(temp);
        if (pass == 0 && c.used > ex->workspace_bytes)
            return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY,
                              "ag_expert_rows over %lld assignments and %d local experts needs %zu bytes of "
                              "workspace, the context has %zu",
                              (long long)TK, (int)El, c.used, ex->workspace_bytes);
    }
    int64_t *start = seg, *end = seg + El;
    const unsigned char *G = (const unsigned char *)grec;
    int32_t st = MOE_LAUNCH(zero_i64_kernel, grid_for(2 * (int64_t)El), THREADS, ex->stream, 2 * (int64_t)El, seg);
    if (st) return st;
    if (TK > 0) {
        uint32_t *const keys[2] = {(uint32_t *)gslot, (uint32_t *)gslot + TK};
        const unsigned g = grid_for(TK);
        if ((st = MOE_LAUNCH(ag_init_kernel, g, THREADS, ex->stream, TK, K, first, El, rrec, G, keys[0], v[0])))
            return st;
        int sel = 0;
        if ((st = dev_sort_pairs_u32(ex, tmp, &temp, keys, v, TK, 0, bits, 0, &sel)) != MOE_OK) return st;
        if ((st = MOE_LAUNCH(segment_bounds_kernel, g, THREADS, ex->stream, TK, (uint32_t)El, keys[sel], start, end)))
            return st;
        if ((st = MOE_LAUNCH(ag_scatter_kernel, g, THREADS, ex->stream, TK, K, first, El, rrec, G, xoff, v[sel], start,
                             gslot, rowtok, (float *)pr)))
            return st;
    }
    const unsigned pad_blocks = (unsigned)(El < 65536 ? El : 65536);
    return MOE_LAUNCH(ag_pad_kernel, pad_blocks, THREADS, ex->stream, El, xoff, start, end, rowtok, (float *)pr);
}

void fill_dispatch(moe_ops *t)
{
    t->dispatch_plan = dispatch_plan;
    t->permute = permute;
    t->unpermute = unpermute;
    t->align_rows = align_rows;
    t->gather_slots = gather_slots;
    t->ag_pack_routing = ag_pack_routing;
    t->ag_expert_rows = ag_expert_rows;
}

} // namespace MOE_KNS

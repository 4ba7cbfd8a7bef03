#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

tu_rng tu_rng_make(uint64_t seed) { tu_rng r = {seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull}; return r; }

static uint64_t next_u64(tu_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double tu_uniform(tu_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(next_u64(r) >> 11) * (1.0 / 9007199254740992.0));
}

double tu_normal(tu_rng *r)
{
    double u1 = tu_uniform(r, 1e-300, 1.0), u2 = tu_uniform(r, 0.0, 1.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void tu_fill_uniform_f(float *x, size_t n, uint64_t seed, double lo, double hi)
{
    tu_rng r = tu_rng_make(seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)tu_uniform(&r, lo, hi);
}

void tu_fill_uniform_d(double *x, size_t n, uint64_t seed, double lo, double hi)
{
    tu_rng r = tu_rng_make(seed);
    for (size_t i = 0; i < n; i++) x[i] = tu_uniform(&r, lo, hi);
}

double tu_rel_err_d(const double *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(ref[i])) return INFINITY;
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    if (den == 0) return sqrt(num);
    return sqrt(num / den);
}

double tu_rel_err_f(const float *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(ref[i])) return INFINITY;
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    if (den == 0) return sqrt(num);
    return sqrt(num / den);
}

double tu_max_abs_diff_d(const double *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

void tu_tensor_make(tu_tensor *h, void *data, uint8_t code, uint8_t bits, int ndim, const int64_t *shape)
{
    memset(h, 0, sizeof *h);
    for (int i = 0; i < ndim && i < 4; i++) h->shape[i] = shape[i];
    h->t.data = data;
    h->t.device.device_type = kDLCPU;
    h->t.device.device_id = 0;
    h->t.ndim = ndim;
    h->t.dtype.code = code;
    h->t.dtype.bits = bits;
    h->t.dtype.lanes = 1;
    h->t.shape = h->shape;
    h->t.strides = NULL;
    h->t.byte_offset = 0;
}

void tu_tensor_f32(tu_tensor *h, float *data, int ndim, const int64_t *shape)
{
    tu_tensor_make(h, data, kDLFloat, 32, ndim, shape);
}

void tu_tensor_f64(tu_tensor *h, double *data, int ndim, const int64_t *shape)
{
    tu_tensor_make(h, data, kDLFloat, 64, ndim, shape);
}

int tu_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

int tu_light(void)
{
    const char *v = getenv("MOE_TEST_LIGHT");
    return v != NULL && v[0] == '1' && v[1] == '\0';
}

/* ---------------------------------------------------------------- the tracking allocator hook */
static void *tracker_alloc(void *u, size_t bytes, size_t alignment, int32_t dt, int32_t id, void *stream)
{
    (void)dt, (void)id, (void)stream;
    tu_tracker *t = u;
    t->calls++;
    if (t->fail_at > 0 && t->calls == t->fail_at) {
        t->fired = 1;
        return NULL;
    }
    void *p = aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
    if (p) t->live_bytes += (int64_t)bytes, t->live_count++;
    return p;
}

static void tracker_free(void *u, void *p, size_t bytes, int32_t dt, int32_t id, void *stream)
{
    (void)dt, (void)id, (void)stream;
    tu_tracker *t = u;
    t->live_bytes -= (int64_t)bytes, t->live_count--;
    free(p);
}

static void tracker_release(void *u) { ((tu_tracker *)u)->released++; }

moe_allocator tu_tracking_allocator(tu_tracker *t)
{
    moe_allocator a = {.struct_size = sizeof a, .user_data = t, .alloc = tracker_alloc, .free = tracker_free,
                       .release = tracker_release};
    return a;
}

int64_t tu_device_bytes(const moe_memory_stats *s)
{
    return s->current_bytes[MOE_MEM_WEIGHTS] + s->current_bytes[MOE_MEM_GRADS] + s->current_bytes[MOE_MEM_ACTIVATIONS] +
           s->current_bytes[MOE_MEM_WORKSPACE] + s->current_bytes[MOE_MEM_COMM];
}

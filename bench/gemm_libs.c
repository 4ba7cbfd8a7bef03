/*
 * gemm_libs: which CPU GEMM library should the engine use? (bench/RESULTS.md, "CPU GEMM library")
 *
 * Times, at the MoE layer's shapes, fp32 and bf16 GEMMs through
 *   openblas-f32     cblas_sgemm on fp32 data
 *   onednn-f32       oneDNN matmul, fp32 in/out
 *   onednn-bf16      oneDNN matmul, bf16 in, fp32 accumulate and out
 *   openblas-bf16cvt bf16 data converted to fp32 (both operands, every call, timed) then cblas_sgemm
 *   onednn-widen     bf16 B widened to fp32 (every call, timed) times fp32 A, oneDNN fp32 matmul: the
 *                    engine's bf16 path on CPUs without bf16 dot products (src/backend/cpu/cpu_gemm.c)
 * Shapes are one expert's GEMMs of the benchmark layer (T=4096, H=1024, F=1024, E=16, K=2, SwiGLU:
 * M = T*K/E = 512 rows per expert), forward, data-gradient and weight-gradient, plus a dense GEMM.
 * Operands are plain row-major with the engine's transposes (weights stored [out,in]); oneDNN gets
 * them through strides, as the engine would pass them. Primitive creation is not timed.
 *
 * usage: gemm_libs [threads=2] [min_seconds_per_shape=2.0]  (GEMM time summed over the libraries)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

typedef struct shape {
    const char *name;
    int ta, tb; /* C[m,n] = op(A) op(B); A stored [m,k] or [k,m] (ta); B stored [k,n] or [n,k] (tb) */
    int64_t m, n, k;
} shape;

static const shape SHAPES[] = {
    {"fc1 fwd   x W1^T", 0, 1, 512, 2048, 1024},
    {"fc2 fwd   h W2^T", 0, 1, 512, 1024, 1024},
    {"fc2 dgrad g W2", 0, 0, 512, 1024, 1024},
    {"fc1 dgrad dz W1", 0, 0, 512, 1024, 2048},
    {"fc2 wgrad g^T h", 1, 0, 1024, 1024, 512},
    {"fc1 wgrad dz^T x", 1, 0, 2048, 1024, 512},
    {"dense", 0, 0, 8192, 6144, 1024},
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))
#define MIN_ROUNDS 5
#define MAX_ROUNDS 200

enum { LIB_OPENBLAS_F32, LIB_ONEDNN_F32, LIB_ONEDNN_BF16, LIB_OPENBLAS_BF16CVT, LIB_ONEDNN_WIDEN, NLIBS };
static const char *LIB_NAMES[NLIBS] = {"openblas-f32", "onednn-f32", "onednn-bf16", "openblas-bf16cvt",
                                       "onednn-widen"};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Lets the previous library's idle worker threads stop spinning (OpenBLAS's pthreads and libgomp's
 * both busy-wait after a call) before the next library is timed. */
static void settle(void)
{
    struct timespec t = {0, 100000000};
    nanosleep(&t, NULL);
}

static uint16_t to_bf16(float f) /* round to nearest even (data are finite) */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static void bf16_to_f32(const uint16_t *src, float *dst, int64_t n, int nt)
{
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, 4);
    }
}

#define DNNL_CHECK(call)                                                                                \
    do {                                                                                                \
        dnnl_status_t st_ = (call);                                                                     \
        if (st_ != dnnl_success) {                                                                      \
            fprintf(stderr, "gemm_libs: %s failed (%d)\n", #call, (int)st_);                            \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)

/* A oneDNN matmul for one shape: src = op(A) [m,k], weights = op(B) [k,n], dst [m,n] fp32. */
typedef struct dnnl_mm {
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} dnnl_mm;

static void dnnl_mm_make(dnnl_mm *mm, dnnl_engine_t eng, const shape *s, dnnl_data_type_t in_dt, void *a, void *b,
                         float *c)
{
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_dims_t a_dims = {s->m, s->k}, b_dims = {s->k, s->n}, c_dims = {s->m, s->n};
    dnnl_dims_t a_str = {s->ta ? 1 : s->k, s->ta ? s->m : 1}, b_str = {s->tb ? 1 : s->n, s->tb ? s->k : 1},
                c_str = {s->n, 1};
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, in_dt, a_str));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, in_dt, b_str));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_str));
    dnnl_matmul_desc_t desc;
    DNNL_CHECK(dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md));
    dnnl_primitive_desc_t pd;
    DNNL_CHECK(dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL));
    DNNL_CHECK(dnnl_primitive_create(&mm->prim, pd));
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
    DNNL_CHECK(dnnl_memory_create(&mm->a, &a_md, eng, a));
    DNNL_CHECK(dnnl_memory_create(&mm->b, &b_md, eng, b));
    DNNL_CHECK(dnnl_memory_create(&mm->c, &c_md, eng, c));
}

static void dnnl_mm_run(const dnnl_mm *mm, dnnl_stream_t stream)
{
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, mm->a}, {DNNL_ARG_WEIGHTS, mm->b}, {DNNL_ARG_DST, mm->c}};
    DNNL_CHECK(dnnl_primitive_execute(mm->prim, stream, 3, args));
    DNNL_CHECK(dnnl_stream_wait(stream));
}

static void dnnl_mm_free(dnnl_mm *mm)
{
    dnnl_primitive_destroy(mm->prim);
    dnnl_memory_destroy(mm->a), dnnl_memory_destroy(mm->b), dnnl_memory_destroy(mm->c);
}

/* Everything one shape needs: fp32 operands, their bf16 roundings, fp32 scratch for the conversion. */
typedef struct operands {
    float *a, *b, *c, *a_cvt, *b_cvt;
    uint16_t *a16, *b16;
} operands;

static void sgemm(const shape *s, const float *a, const float *b, float *c)
{
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, (int)s->m,
                (int)s->n, (int)s->k, 1.0f, a, (int)(s->ta ? s->m : s->k), b, (int)(s->tb ? s->k : s->n), 0.0f, c,
                (int)s->n);
}

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* One timed call of one library on one shape; returns seconds. */
static double time_call(int lib, const shape *s, operands *o, const dnnl_mm *mm, dnnl_stream_t stream, int nt)
{
    const double t0 = now();
    switch (lib) {
    case LIB_OPENBLAS_F32: sgemm(s, o->a, o->b, o->c); break;
    case LIB_ONEDNN_F32:
    case LIB_ONEDNN_BF16: dnnl_mm_run(mm, stream); break;
    case LIB_ONEDNN_WIDEN: /* mm multiplies o->a by o->b_cvt */
        bf16_to_f32(o->b16, o->b_cvt, s->k * s->n, nt);
        dnnl_mm_run(mm, stream);
        break;
    default:
        bf16_to_f32(o->a16, o->a_cvt, s->m * s->k, nt);
        bf16_to_f32(o->b16, o->b_cvt, s->k * s->n, nt);
        sgemm(s, o->a_cvt, o->b_cvt, o->c);
        break;
    }
    return now() - t0;
}

/* ||x - y|| / ||y|| */
static double rel_diff(const float *x, const float *y, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        den += (double)y[i] * y[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

int main(int argc, char **argv)
{
    const int nt = argc > 1 ? atoi(argv[1]) : 2;
    const double min_s = argc > 2 ? atof(argv[2]) : 2.0;
    if (nt < 1 || min_s < 0) {
        fprintf(stderr, "usage: gemm_libs [threads=2] [min_seconds_per_shape=2.0]\n");
        return 2;
    }
    openblas_set_num_threads(nt);
    omp_set_num_threads(nt); /* oneDNN runs on the OpenMP runtime */
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    DNNL_CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&stream, eng, dnnl_stream_default_flags));
    printf("gemm_libs: %d threads, OpenBLAS core %s, oneDNN %d.%d.%d, GFLOP/s median (best)\n", nt,
           openblas_get_corename(), dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch);
    printf("%-17s %18s %14s %14s %14s %16s %14s   check (rel. diff)\n", "gemm", "m x n x k", LIB_NAMES[0],
           LIB_NAMES[1], LIB_NAMES[2], LIB_NAMES[3], LIB_NAMES[4]);
    for (int si = 0; si < NSHAPES; si++) {
        const shape *s = &SHAPES[si];
        const int64_t na = s->m * s->k, nb = s->k * s->n, nc = s->m * s->n;
        operands o = {malloc((size_t)na * 4), malloc((size_t)nb * 4), malloc((size_t)nc * 4), malloc((size_t)na * 4),
                      malloc((size_t)nb * 4), malloc((size_t)na * 2), malloc((size_t)nb * 2)};
        float *c_ref = malloc((size_t)nc * 4), *c_bf = malloc((size_t)nc * 4), *c_cvt = malloc((size_t)nc * 4);
        if (!o.a || !o.b || !o.c || !o.a_cvt || !o.b_cvt || !o.a16 || !o.b16 || !c_ref || !c_bf || !c_cvt) {
            fprintf(stderr, "gemm_libs: out of memory\n");
            return 1;
        }
        uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(si + 1);
        for (int64_t i = 0; i < na + nb; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            const float v = (float)((double)(r >> 40) / 16777216.0 - 0.5);
            if (i < na) {
                o.a[i] = v;
                o.a16[i] = to_bf16(v);
            } else {
                o.b[i - na] = v;
                o.b16[i - na] = to_bf16(v);
            }
        }
        dnnl_mm mm32, mm16, mmw;
        dnnl_mm_make(&mm32, eng, s, dnnl_f32, o.a, o.b, o.c);
        dnnl_mm_make(&mm16, eng, s, dnnl_bf16, o.a16, o.b16, o.c);
        dnnl_mm_make(&mmw, eng, s, dnnl_f32, o.a, o.b_cvt, o.c);
        /* The libraries take turns, one call each per round, so that load from other processes on a
         * shared machine hits them alike; the first round is a warm-up. */
        double times[NLIBS][MAX_ROUNDS], med[NLIBS], best[NLIBS], spent = 0;
        char check[160] = "";
        double widen_err = 0;
        int rounds = 0;
        for (int round = -1; round < MAX_ROUNDS && (rounds < MIN_ROUNDS || spent < min_s); round++) {
            for (int lib = 0; lib < NLIBS; lib++) {
                settle();
                const dnnl_mm *mm = lib == LIB_ONEDNN_BF16 ? &mm16 : lib == LIB_ONEDNN_WIDEN ? &mmw : &mm32;
                const double t = time_call(lib, s, &o, mm, stream, nt);
                if (round >= 0) {
                    times[lib][rounds] = t;
                    spent += t;
                }
                if (round != -1) continue;
                /* outputs checked once, on the warm-up round */
                if (lib == LIB_OPENBLAS_F32) memcpy(c_ref, o.c, (size_t)nc * 4);
                if (lib == LIB_ONEDNN_F32) snprintf(check, sizeof check, "f32 %.1e", rel_diff(o.c, c_ref, nc));
                if (lib == LIB_ONEDNN_BF16) memcpy(c_bf, o.c, (size_t)nc * 4);
                if (lib == LIB_OPENBLAS_BF16CVT) memcpy(c_cvt, o.c, (size_t)nc * 4);
                if (lib == LIB_ONEDNN_WIDEN) widen_err = rel_diff(o.c, c_ref, nc);
            }
            if (round >= 0) rounds++;
        }
        const double flop = 2.0 * (double)s->m * (double)s->n * (double)s->k;
        for (int lib = 0; lib < NLIBS; lib++) {
            qsort(times[lib], (size_t)rounds, sizeof(double), cmp_double);
            best[lib] = flop / times[lib][0] * 1e-9;
            med[lib] = flop / times[lib][rounds / 2] * 1e-9;
        }
        /* both bf16 paths compute the same products of bf16 values in fp32 */
        const size_t used = strlen(check);
        snprintf(check + used, sizeof check - used, " bf16 %.1e (vs f32 %.1e) widen vs f32 %.1e",
                 rel_diff(c_bf, c_cvt, nc), rel_diff(c_bf, c_ref, nc), widen_err);
        char cells[NLIBS][32];
        for (int lib = 0; lib < NLIBS; lib++) snprintf(cells[lib], sizeof cells[lib], "%6.1f (%5.1f)", med[lib], best[lib]);
        printf("%-17s %4lld x %4lld x %4lld %14s %14s %14s %16s %14s   %s\n", s->name, (long long)s->m,
               (long long)s->n, (long long)s->k, cells[0], cells[1], cells[2], cells[3], cells[4], check);
        fflush(stdout);
        dnnl_mm_free(&mm32), dnnl_mm_free(&mm16), dnnl_mm_free(&mmw);
        free(o.a), free(o.b), free(o.c), free(o.a_cvt), free(o.b_cvt), free(o.a16), free(o.b16), free(c_ref), free(c_bf), free(c_cvt);
    }
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
    return 0;
}

/* The simulator backend (sim_backend.h): the CPU backend's memory, streams and events (the
 * simulated device's memory is host memory), the kernels' op table, the CPU backend's GEMMs, and
 * gemm_q routed as the CUDA backend routes it: the block-scaled path (gemm_q_scaled.c) over the
 * stand-in for cuBLASLt's block-scaled matmul (sim_lt_matmul.c) for the pairs it verifies, else the
 * exact path, the dequantize kernel then the GEMM. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "moe.h"
#include "backend/gemm_q.h"
#include "backend/op_names.h"
#include "sim_backend.h"

void moe_sim_kernel_table(moe_ops *t); /* kernels/table.cu compiled with -DMOE_SIM */
void moe_sim_plant(moe_ops *t, const char *bug); /* planted.cc */

static moe_ops sim_f32;
static moe_backend sim_backend;
static pthread_once_t sim_once = PTHREAD_ONCE_INIT;

/* The block-scaled path's state: one per backend (sim, planted "ltlayout"), shared by every context
 * of the process, so calls are serialised. */
static pthread_mutex_t lt_lock = PTHREAD_MUTEX_INITIALIZER;
static moe_lt_probe lt_probe[2];

static int32_t gemm_q_on(int which, const moe_ops *t, moe_lt_matmul_fn mm, const moe_exec *ex, int64_t m, int64_t n,
                         int64_t k, double alpha, const moe_qmat *a, const moe_qmat *b, double beta, void *c,
                         int64_t ldc, void *work)
{
    const moe_lt_engine eng = {.backend = &sim_backend, .ops = t, .matmul = mm, .probe = &lt_probe[which],
                               .may_probe = 1};
    pthread_mutex_lock(&lt_lock);
    const int32_t st = moe_gemm_q_lt(&eng, ex, m, n, k, alpha, a, b, beta, c, ldc, work);
    pthread_mutex_unlock(&lt_lock);
    return st;
}

/* The exact path's result is bitwise the CPU backend's (the same composition over the CPU's
 * dequantize, bit-identical to the kernel's); the block-scaled one differs by summation order. */
static int32_t sim_gemm_q(const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const moe_qmat *a,
                          const moe_qmat *b, double beta, void *c, int64_t ldc, void *work)
{
    return gemm_q_on(0, &sim_f32, moe_sim_lt_matmul, ex, m, n, k, alpha, a, b, beta, c, ldc, work);
}

static const moe_ops *sim_ops(int32_t dtype) { return dtype == MOE_DTYPE_FP32 ? &sim_f32 : NULL; }

static int32_t sim_supports_op(int32_t dtype, const char *op)
{
    return dtype == MOE_DTYPE_FP32 && moe_op_slot_present(&sim_f32, op);
}

static void sim_init(void)
{
    sim_f32.name = "sim-f32";
    sim_f32.dtype = MOE_DTYPE_FP32;
    sim_f32.elem_size = sizeof(float);
    moe_sim_kernel_table(&sim_f32);
    sim_f32.gemm = moe_cpu_ops_f32.gemm;
    sim_f32.gemm_grouped_rows = moe_cpu_ops_f32.gemm_grouped_rows;
    sim_f32.gemm_grouped_reduce = moe_cpu_ops_f32.gemm_grouped_reduce;
    sim_f32.gemm_q = sim_gemm_q;
    sim_backend = moe_backend_cpu;
    sim_backend.name = "sim";
    sim_backend.caps &= ~(uint32_t)MOE_BACKEND_CAP_FP64;
    sim_backend.ops = sim_ops;
    sim_backend.supports_op = sim_supports_op;
    /* op workspace as the CUDA backend gives each context (device-wide sorts and scans carve theirs
     * from it) */
    sim_backend.workspace_bytes = (size_t)32 << 20;
}

const moe_backend *moe_sim_backend(void)
{
    pthread_once(&sim_once, sim_init);
    return &sim_backend;
}

/* ---- the planted-bug variants (planted.cc): one op replaced by a deliberately wrong kernel ---- */
enum { N_PLANTED = 7, LT_PLANTED = 2 };
static moe_ops planted_f32[N_PLANTED];
static moe_backend planted_backend[N_PLANTED];
static const char *const planted_names[N_PLANTED] = {"nosync", "offbyone", "ltlayout", "argmax",
                                                     "nosync1", "bf16rne",  "idx32"};
static char planted_table_names[N_PLANTED][48], planted_backend_names[N_PLANTED][48];

#define PLANTED_OPS(i)                                                                                               \
    static const moe_ops *planted_ops##i(int32_t dtype) { return dtype == MOE_DTYPE_FP32 ? &planted_f32[i] : NULL; }
PLANTED_OPS(0)
PLANTED_OPS(1)
PLANTED_OPS(2)
PLANTED_OPS(3)
PLANTED_OPS(4)
PLANTED_OPS(5)
PLANTED_OPS(6)

static int32_t planted_gemm_q(const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const moe_qmat *a,
                              const moe_qmat *b, double beta, void *c, int64_t ldc, void *work)
{
    return gemm_q_on(1, &planted_f32[LT_PLANTED], moe_sim_lt_matmul_planted, ex, m, n, k, alpha, a, b, beta, c, ldc,
                     work);
}

const moe_backend *moe_sim_planted_backend(const char *bug)
{
    static const moe_ops *(*const ops_of[N_PLANTED])(int32_t) = {planted_ops0, planted_ops1, planted_ops2,
                                                                 planted_ops3, planted_ops4, planted_ops5,
                                                                 planted_ops6};
    const moe_backend *sim = moe_sim_backend();
    for (int i = 0; i < N_PLANTED; i++) {
        if (strcmp(bug, planted_names[i]) != 0) continue;
        if (!planted_backend[i].name) {
            snprintf(planted_table_names[i], sizeof planted_table_names[i], "sim-planted-%s-f32", bug);
            snprintf(planted_backend_names[i], sizeof planted_backend_names[i], "sim-planted-%s", bug);
            planted_f32[i] = sim_f32;
            planted_f32[i].name = planted_table_names[i];
            if (i == LT_PLANTED) planted_f32[i].gemm_q = planted_gemm_q;
            else moe_sim_plant(&planted_f32[i], bug);
            planted_backend[i] = *sim;
            planted_backend[i].name = planted_backend_names[i];
            planted_backend[i].ops = ops_of[i];
        }
        return &planted_backend[i];
    }
    return NULL;
}

static moe_lt_probe *probe_of(const moe_backend *be)
{
    if (be == moe_sim_backend()) return &lt_probe[0];
    if (be == &planted_backend[LT_PLANTED]) return &lt_probe[1];
    return NULL;
}

moe_lt_probe moe_sim_lt_probe(const moe_backend *be)
{
    moe_lt_probe out = {{0}, {0}, 0, 0};
    pthread_mutex_lock(&lt_lock);
    const moe_lt_probe *p = probe_of(be);
    if (p) out = *p;
    pthread_mutex_unlock(&lt_lock);
    return out;
}

void moe_sim_lt_probe_reset(const moe_backend *be)
{
    pthread_mutex_lock(&lt_lock);
    moe_lt_probe *p = probe_of(be);
    if (p) memset(p, 0, sizeof *p);
    pthread_mutex_unlock(&lt_lock);
}

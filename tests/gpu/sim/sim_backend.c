/* The simulator backend (sim_backend.h): the CPU backend's memory, streams and events (the
 * simulated device's memory is host memory), the kernels' op table, the CPU backend's GEMMs, and
 * gemm_q composed as the CUDA backend's exact path is: the dequantize kernel, then the GEMM. */
#include <pthread.h>
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

/* The simulated dequantize kernel into `work`, then the (CPU) fp32 GEMM: the kernels' dequantize
 * path runs in every CI stage, and the result is bitwise the CPU backend's, whose gemm_q is the same
 * composition over the CPU's dequantize (bit-identical to the kernel's). */
static int32_t sim_gemm_q(const moe_exec *ex, int64_t m, int64_t n, int64_t k, double alpha, const moe_qmat *a,
                          const moe_qmat *b, double beta, void *c, int64_t ldc, void *work)
{
    return moe_gemm_q_by_dequantize(&sim_f32, ex, m, n, k, alpha, a, b, beta, c, ldc, work);
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
static moe_ops planted_f32[2];
static moe_backend planted_backend[2];
static const char *const planted_names[2] = {"nosync", "offbyone"};

static const moe_ops *planted_ops0(int32_t dtype) { return dtype == MOE_DTYPE_FP32 ? &planted_f32[0] : NULL; }
static const moe_ops *planted_ops1(int32_t dtype) { return dtype == MOE_DTYPE_FP32 ? &planted_f32[1] : NULL; }

const moe_backend *moe_sim_planted_backend(const char *bug)
{
    const moe_backend *sim = moe_sim_backend();
    for (int i = 0; i < 2; i++) {
        if (strcmp(bug, planted_names[i]) != 0) continue;
        if (!planted_backend[i].name) {
            planted_f32[i] = sim_f32;
            planted_f32[i].name = i == 0 ? "sim-planted-nosync-f32" : "sim-planted-offbyone-f32";
            moe_sim_plant(&planted_f32[i], bug);
            planted_backend[i] = *sim;
            planted_backend[i].name = i == 0 ? "sim-planted-nosync" : "sim-planted-offbyone";
            planted_backend[i].ops = i == 0 ? planted_ops0 : planted_ops1;
        }
        return &planted_backend[i];
    }
    return NULL;
}

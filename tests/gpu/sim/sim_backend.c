/* The simulator backend (sim_backend.h): the CPU backend's memory, streams and events (the
 * simulated device's memory is host memory), the kernels' op table, the CPU backend's GEMMs. */
#include <pthread.h>

#include "moe.h"
#include "backend/op_names.h"
#include "sim_backend.h"

void moe_sim_kernel_table(moe_ops *t); /* kernels/table.cu compiled with -DMOE_SIM */

static moe_ops sim_f32;
static moe_backend sim_backend;
static pthread_once_t sim_once = PTHREAD_ONCE_INIT;

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

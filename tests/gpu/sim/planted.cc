/*
 * Kernels with planted bugs: the proof that the simulator and the comparison harness catch the two
 * classic kernel mistakes. Each replaces one op of the sim backend (sim_backend.c,
 * moe_sim_planted_backend); CTest runs the harness against them and passes only if exactly that op
 * fails (tests/backend/CMakeLists.txt, backend_ops_sim_planted_*).
 *   nosync:    row_dots as a shared-memory block reduction with the __syncthreads between the
 *              partial sums and their total left out;
 *   offbyone:  sigmoid_fwd whose loop stops one element early.
 */
#include "kcommon.cuh"

namespace moe_ksim_planted {

using namespace moe_ksim;

constexpr int RD_THREADS = 128;

__global__ void row_dots_nosync(int64_t R, int64_t H, const float *a, const float *b, float *out)
{
    __shared__ double part[RD_THREADS];
    int64_t r = blockIdx.x;
    double s = 0;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) s += (double)a[r * H + j] * (double)b[r * H + j];
    part[threadIdx.x] = s;
    /* BUG (planted): a __syncthreads() belongs here */
    if (threadIdx.x == 0) {
        double t = 0;
        for (int i = 0; i < RD_THREADS; i++) t += part[i];
        out[r] = (float)t;
    }
}

static int32_t row_dots(const moe_exec *ex, int64_t R, int64_t H, const void *a, const void *b, void *out)
{
    if (!ex || R < 0 || H < 0 || (R > 0 && (!out || (H > 0 && (!a || !b))))) return MOE_ERR_INVALID_ARGUMENT;
    if (R == 0) return MOE_OK;
    return MOE_LAUNCH(row_dots_nosync, (unsigned)R, RD_THREADS, ex->stream, R, H, (const float *)a, (const float *)b,
                      (float *)out);
}

__global__ void sigmoid_offbyone(int64_t n, const float *x, float *y)
{
    for (int64_t i = gtid(); i < n - 1; i += gstride()) /* BUG (planted): i < n */
        y[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

static int32_t sigmoid_fwd(const moe_exec *ex, int64_t n, const void *x, void *y)
{
    if (!ex || n < 0 || (n > 0 && (!x || !y))) return MOE_ERR_INVALID_ARGUMENT;
    if (n == 0) return MOE_OK;
    return MOE_LAUNCH(sigmoid_offbyone, grid_for(n), THREADS, ex->stream, n, (const float *)x, (float *)y);
}

} // namespace moe_ksim_planted

extern "C" void moe_sim_plant(moe_ops *t, const char *bug);
extern "C" void moe_sim_plant(moe_ops *t, const char *bug)
{
    if (std::strcmp(bug, "nosync") == 0) t->row_dots = moe_ksim_planted::row_dots;
    else if (std::strcmp(bug, "offbyone") == 0) t->sigmoid_fwd = moe_ksim_planted::sigmoid_fwd;
}

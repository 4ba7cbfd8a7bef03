/*
 * Which low-precision recipes (moe_layer_config.quant_recipe) a CUDA layer accepts on which compute
 * capability (src/backend/cuda/cuda_backend.c, cuda_quant_recipe_supported), on the device simulator,
 * whose cuBLASLt stand-in has the scale modes each capability has (cuBLAS docs, cublasLtMatmul(),
 * scaling modes; tests/gpu/devsim/cublaslt.cc):
 *   FP8 tensorwise (SCALAR_32F)                    compute capability 8.9 and newer
 *   FP8 blockwise (VEC128_32F / BLK128x128_32F)    9.x only (Hopper): Ada and Blackwell have no such kernels
 *   MXFP8 (VEC32_UE8M0), NVFP4 (VEC16_UE4M3)       10.0 and newer (Blackwell)
 * A recipe the device has no GEMMs for is refused at moe_layer_create with MOE_ERR_UNSUPPORTED and a
 * message naming it, rather than accepted and run on the exact (dequantise + fp32 GEMM) path at a
 * fraction of its speed. An accepted block-scaled recipe runs its expert GEMMs block-scaled: a
 * forward with sizes the path applies to makes block-scaled calls and no exact ones (moe_lt_probe).
 *
 * MOE_DEVSIM_CC is read once per process, so the parent runs no CUDA call: it starts itself once per
 * capability (89, 90, 100) with "--cc N" and that environment. Each check prints a line when it fails;
 * each process ends with "cc N: P passed, F failed"; the exit status is 0 only when every child passed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_device.h"
#include "runtime/runtime.h"
#include "moe.h"
#include "testutil.h"

static int g_cc, passed, failed;

#define CHECK(cond, ...)                                                                                           \
    do {                                                                                                           \
        if (cond) passed++;                                                                                        \
        else {                                                                                                     \
            failed++;                                                                                              \
            printf("FAIL [cc %d] line %d: %s: ", g_cc, __LINE__, #cond);                                           \
            printf(__VA_ARGS__);                                                                                   \
            printf("\n");                                                                                          \
        }                                                                                                          \
    } while (0)

/* sizes the block-scaled path applies to: k (H for the first GEMM, F for the second) a multiple of
 * 128, expert rows padded to multiples of 16 */
enum { T = 128, H = 128, F = 128, E = 4, K = 2 };

static const struct {
    int32_t recipe;
    const char *name;
    int block_scaled;
} recipes[] = {
    {MOE_QUANT_FP8_TENSORWISE, "MOE_QUANT_FP8_TENSORWISE", 0},
    {MOE_QUANT_FP8_BLOCKWISE, "MOE_QUANT_FP8_BLOCKWISE", 1},
    {MOE_QUANT_MXFP8, "MOE_QUANT_MXFP8", 1},
    {MOE_QUANT_NVFP4, "MOE_QUANT_NVFP4", 1},
};

/* What cuBLASLt has on compute capability cc (major * 10 + minor). */
static int expected(int cc, int32_t recipe)
{
    switch (recipe) {
    case MOE_QUANT_FP8_TENSORWISE: return cc >= 89;
    case MOE_QUANT_FP8_BLOCKWISE: return cc >= 90 && cc < 100;
    case MOE_QUANT_MXFP8:
    case MOE_QUANT_NVFP4: return cc >= 100;
    default: return 0;
    }
}

static void *device_copy(const float *host, size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof *host) != cudaSuccess) return NULL;
    if (cudaMemcpy(p, host, n * sizeof *host, cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
    /* the pageable copy returns before it lands; the layer's non-blocking stream does not wait for it */
    if (cudaDeviceSynchronize() != cudaSuccess) return NULL;
    return p;
}

static void make_tensor(tu_tensor *t, void *data)
{
    int64_t shape[2] = {T, H};
    tu_tensor_f32(t, data, 2, shape);
    t->t.device.device_type = kDLCUDA;
    t->t.device.device_id = 0;
}

/* One recipe on a fresh context: created or refused as expected; if created, one forward, block-scaled
 * where the recipe is. */
static void check_recipe(int i)
{
    const int32_t recipe = recipes[i].recipe;
    const char *name = recipes[i].name;
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.device_type = MOE_DEVICE_CUDA;
    moe_context *ctx = NULL;
    int32_t st = moe_context_create(&cc, &ctx);
    CHECK(st == MOE_OK, "CUDA context: status %d", st);
    if (st) return;
    moe_layer_config c;
    moe_layer_config_init(&c, sizeof c);
    c.hidden_size = H;
    c.ffn_hidden_size = F;
    c.num_experts = E;
    c.top_k = K;
    c.activation = MOE_ACT_SWIGLU;
    c.param_dtype = MOE_DTYPE_FP32;
    c.seed = 11;
    c.quant_recipe = recipe;
    moe_layer *layer = NULL;
    st = moe_layer_create(ctx, &c, &layer);
    char msg[512] = "";
    moe_context_last_error(ctx, msg, sizeof msg);
    if (!expected(g_cc, recipe)) {
        CHECK(st == MOE_ERR_UNSUPPORTED, "%s accepted (status %d); cuBLASLt has no GEMMs for it here", name, st);
        if (st == MOE_ERR_UNSUPPORTED)
            CHECK(strstr(msg, name) != NULL && strstr(msg, "cannot run") != NULL,
                  "%s refused without a message naming it: \"%s\"", name, msg);
    } else {
        CHECK(st == MOE_OK, "%s refused (status %d): %s", name, st, msg);
    }
    if (st) {
        moe_context_destroy(ctx);
        return;
    }
    /* one forward of an accepted recipe (wrongly accepted ones too, to show which path they take): it
     * runs, block-scaled where the recipe is */
    static float hx[T * H];
    tu_fill_uniform_f(hx, T * H, 5, -1, 1);
    void *x = device_copy(hx, T * H), *y = device_copy(hx, T * H);
    CHECK(x && y, "device buffers");
    moe_step_config sc;
    moe_step_config_init(&sc, sizeof sc);
    moe_step *step = NULL;
    CHECK(moe_step_create(layer, &sc, &step) == MOE_OK, "moe_step_create");
    if (x && y && step) {
        tu_tensor tx, ty;
        make_tensor(&tx, x);
        make_tensor(&ty, y);
        st = moe_layer_forward(layer, step, &tx.t, &ty.t, NULL);
        msg[0] = 0;
        if (st) moe_context_last_error(ctx, msg, sizeof msg);
        CHECK(st == MOE_OK, "%s forward: status %d: %s", name, st, msg);
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "%s forward: synchronise", name);
        if (recipes[i].block_scaled) {
            const moe_lt_probe *p = &((const moe_cuda_device *)ctx->device_state)->lt_probe;
            CHECK(p->scaled_calls > 0 && p->exact_calls == 0,
                  "%s forward: %lld block-scaled GEMMs, %lld on the exact path; an accepted recipe must run "
                  "block-scaled", name, (long long)p->scaled_calls, (long long)p->exact_calls);
        }
    }
    moe_step_destroy(step);
    moe_layer_destroy(layer);
    cudaFree(x);
    cudaFree(y);
    moe_context_destroy(ctx);
}

static int child(int cc)
{
    g_cc = cc;
    int major = 0, minor = 0;
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
              cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess &&
              major * 10 + minor == cc,
          "the simulated device reports %d.%d", major, minor);
    for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++) check_recipe((int)i);
    printf("cc %d: %d passed, %d failed\n", cc, passed, failed);
    fflush(stdout);
    return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--cc") == 0) return child(atoi(argv[2]));
    static const char *ccs[] = {"89", "90", "100"};
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            setenv("MOE_DEVSIM_CC", ccs[i], 1);
            execl("/proc/self/exe", argv[0], "--cc", ccs[i], (char *)NULL);
            perror("exec");
            _exit(127);
        }
        int status = 0;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("FAIL: the cc %s process ended with status 0x%x\n", ccs[i], status);
            bad++;
        }
    }
    printf("%s\n", bad ? "FAILED" : "all compute capabilities passed");
    return bad ? 1 : 0;
}

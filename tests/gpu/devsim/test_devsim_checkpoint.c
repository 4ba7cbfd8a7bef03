/*
 * Checkpoints across devices on the device simulator: a CPU layer's checkpoint loads into a CUDA
 * context's layer and the other way round (fp32; a bf16 CUDA layer into an fp32 CPU layer, an exact
 * widening), with a companion in host memory attached to the CUDA layer (saved from and loaded into
 * host memory while the layer lives on the device). Every parameter is compared element by element
 * after copying the CUDA layer's to the host with cudaMemcpy. And a resumed run on the simulated GPU:
 * train 2 steps, save, train 2 more; a fresh CUDA layer loads and trains the same 2, with outputs
 * equal bitwise.
 * Prints one line per failed check and "N passed, M failed" last.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "moe.h"
#include "devsim_check.h"
#include "devsim_control.h"
#include "testutil.h"

enum { H = 16, F = 8, E = 4, K = 2, FS = 8 };


static const char *err(moe_context *ctx)
{
    static char buf[1024];
    buf[0] = 0;
    moe_context_last_error(ctx, buf, sizeof buf);
    return buf;
}

static moe_context *context(int32_t device)
{
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.device_type = device;
    moe_context *ctx = NULL;
    const int32_t st = moe_context_create(&cc, &ctx);
    CHECK(st == MOE_OK, "context on device %d: status %d", device, st);
    return ctx;
}

static moe_layer *layer(moe_context *ctx, int32_t dtype, uint64_t seed)
{
    moe_layer_config c;
    moe_layer_config_init(&c, sizeof c);
    c.hidden_size = H, c.ffn_hidden_size = F, c.num_experts = E, c.top_k = K;
    c.activation = MOE_ACT_SWIGLU;
    c.score_function = MOE_SCORE_SIGMOID;
    c.expert_bias = 1;
    c.shared_ffn_hidden_size = FS;
    c.param_dtype = dtype;
    c.seed = seed;
    moe_layer *l = NULL;
    const int32_t st = moe_layer_create(ctx, &c, &l);
    CHECK(st == MOE_OK, "layer: %s", err(ctx));
    return l;
}

/* A slot's parameter as fp32 host values, whatever device and dtype it lives in. */
static float *host_param(moe_layer *l, int32_t slot, int on_device, int64_t *n)
{
    DLManagedTensor *m = NULL;
    if (moe_layer_param(l, slot, &m) != MOE_OK) return NULL;
    const DLTensor *t = &m->dl_tensor;
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
    const size_t es = t->dtype.bits / 8;
    unsigned char *raw = malloc((size_t)numel * es);
    if (on_device) cudaMemcpy(raw, t->data, (size_t)numel * es, cudaMemcpyDeviceToHost);
    else memcpy(raw, t->data, (size_t)numel * es);
    float *out = malloc(sizeof(float) * (size_t)numel);
    for (int64_t i = 0; i < numel; i++) {
        if (es == 2) {
            uint32_t u = (uint32_t)((uint16_t *)raw)[i] << 16;
            memcpy(&out[i], &u, 4);
        } else {
            out[i] = ((float *)raw)[i];
        }
    }
    free(raw);
    m->deleter(m);
    *n = numel;
    return out;
}

static int same_params(moe_layer *a, int a_dev, moe_layer *b, int b_dev)
{
    int same = 1;
    for (int32_t s = 0; s < MOE_PARAM_NUM_SLOTS; s++) {
        if (!moe_layer_has_param(a, s)) continue;
        int64_t na = 0, nb = 0;
        float *pa = host_param(a, s, a_dev, &na), *pb = host_param(b, s, b_dev, &nb);
        same = same && pa && pb && na == nb && memcmp(pa, pb, sizeof(float) * (size_t)na) == 0;
        free(pa), free(pb);
    }
    return same;
}

static int32_t ckpt(moe_layer *l, const char *dir, int save)
{
    moe_checkpoint_config c;
    moe_checkpoint_config_init(&c, sizeof c);
    c.dir = dir;
    return save ? moe_layer_save(l, &c) : moe_layer_load(l, &c);
}

enum { T = 24 };

/* One training step of a CUDA layer on fixed inputs (seeded by k); y (host, [T, H]) gets the output. */
static int32_t train(moe_layer *l, int k, float *y)
{
    float x[T * H], dy[T * H];
    for (int i = 0; i < T * H; i++) {
        x[i] = (float)((i * 7 + k * 13) % 23 - 11) / 11.0f;
        dy[i] = (float)((i * 5 + k * 3) % 17 - 8) / 8.0f;
    }
    const size_t bytes = sizeof x;
    float *dx_d = NULL, *dy_d = NULL, *x_d = NULL, *y_d = NULL;
    cudaMalloc((void **)&x_d, bytes), cudaMalloc((void **)&y_d, bytes);
    cudaMalloc((void **)&dy_d, bytes), cudaMalloc((void **)&dx_d, bytes);
    cudaMemcpy(x_d, x, bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(dy_d, dy, bytes, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize(); /* pageable copies return before they land; the layer's stream does not wait for them */
    int64_t shape[2] = {T, H};
    tu_tensor tx, ty, tdy, tdx;
    tu_tensor_f32(&tx, x_d, 2, shape), tu_tensor_f32(&ty, y_d, 2, shape);
    tu_tensor_f32(&tdy, dy_d, 2, shape), tu_tensor_f32(&tdx, dx_d, 2, shape);
    tu_tensor *all[4] = {&tx, &ty, &tdy, &tdx};
    for (int i = 0; i < 4; i++) all[i]->t.device.device_type = kDLCUDA, all[i]->t.device.device_id = 0;
    moe_step_config sc;
    moe_step_config_init(&sc, sizeof sc);
    moe_step *step = NULL;
    int32_t st = moe_step_create(l, &sc, &step);
    if (!st) st = moe_layer_forward(l, step, &tx.t, &ty.t, NULL);
    if (!st) st = moe_layer_backward(l, step, &tdy.t, &tdx.t, NULL);
    if (!st) st = moe_layer_update_expert_bias(l, NULL);
    moe_step_destroy(step);
    cudaMemcpy(y, y_d, bytes, cudaMemcpyDeviceToHost);
    cudaFree(x_d), cudaFree(y_d), cudaFree(dy_d), cudaFree(dx_d);
    return st;
}

int main(void)
{
    char dir[] = "/tmp/moe_devsim_ckpt_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    moe_context *cpu = context(MOE_DEVICE_CPU), *gpu = context(MOE_DEVICE_CUDA);
    if (!cpu || !gpu) return 1;

    /* CPU -> CUDA */
    moe_layer *c1 = layer(cpu, MOE_DTYPE_FP32, 1), *g1 = layer(gpu, MOE_DTYPE_FP32, 2);
    CHECK(!same_params(c1, 0, g1, 1), "the layers start out equal");
    CHECK(ckpt(c1, dir, 1) == MOE_OK, "save on the CPU: %s", err(cpu));
    CHECK(ckpt(g1, dir, 0) == MOE_OK, "load into the CUDA layer: %s", err(gpu));
    CHECK(same_params(c1, 0, g1, 1), "the CUDA layer differs from the CPU layer it loaded");

    /* CUDA (bf16, with a host companion) -> CPU (fp32): exact widening; the companion comes back */
    moe_layer *g2 = layer(gpu, MOE_DTYPE_BF16, 3), *c2 = layer(cpu, MOE_DTYPE_FP32, 4);
    enum { N2 = E * H * F };
    float mom[N2], got[N2];
    for (int i = 0; i < N2; i++) mom[i] = (float)i / 8, got[i] = -1;
    int64_t shape[3] = {E, H, F};
    tu_tensor tg, tc;
    tu_tensor_f32(&tg, mom, 3, shape); /* kDLCPU memory attached to a CUDA layer */
    tu_tensor_f32(&tc, got, 3, shape);
    CHECK(moe_layer_attach_state(g2, MOE_PARAM_EXPERT_FC2, "exp_avg", &tg.t) == MOE_OK, "%s", err(gpu));
    CHECK(moe_layer_attach_state(c2, MOE_PARAM_EXPERT_FC2, "exp_avg", &tc.t) == MOE_OK, "%s", err(cpu));
    CHECK(ckpt(g2, dir, 1) == MOE_OK, "save on CUDA: %s", err(gpu));
    CHECK(ckpt(c2, dir, 0) == MOE_OK, "load into the CPU layer: %s", err(cpu));
    CHECK(same_params(g2, 1, c2, 0), "the fp32 CPU layer differs from the bf16 CUDA layer it loaded");
    CHECK(memcmp(mom, got, sizeof mom) == 0, "the companion did not come back");
    /* and back: the fp32 CPU checkpoint narrows into bf16 only when asked */
    CHECK(ckpt(c2, dir, 1) == MOE_OK, "save on the CPU: %s", err(cpu));
    CHECK(ckpt(g2, dir, 0) == MOE_ERR_INVALID_ARGUMENT, "an fp32 -> bf16 load without CAST: %s", err(gpu));

    /* a resumed run on the simulated GPU equals the uninterrupted one bitwise */
    moe_layer *ga = layer(gpu, MOE_DTYPE_FP32, 5), *gb = layer(gpu, MOE_DTYPE_FP32, 6);
    float ya[T * H], yb[T * H];
    int32_t st = MOE_OK;
    for (int k = 0; k < 2 && !st; k++) st = train(ga, k, ya);
    CHECK(st == MOE_OK, "training: %s", err(gpu));
    moe_checkpoint_config g;
    moe_checkpoint_config_init(&g, sizeof g);
    g.dir = dir;
    g.flags = MOE_CHECKPOINT_GRADS;
    CHECK(moe_layer_save(ga, &g) == MOE_OK, "save: %s", err(gpu));
    CHECK(moe_layer_load(gb, &g) == MOE_OK, "load: %s", err(gpu));
    for (int k = 2; k < 4; k++) {
        CHECK(train(ga, k, ya) == MOE_OK && train(gb, k, yb) == MOE_OK, "training: %s", err(gpu));
        CHECK(memcmp(ya, yb, sizeof ya) == 0, "step %d: the resumed output differs", k);
        int finite = 1; /* equal NaNs would hide an input that had not landed (fresh device memory is NaN) */
        for (int i = 0; i < T * H; i++) finite = finite && isfinite(ya[i]);
        CHECK(finite, "step %d: the output is not finite", k);
    }
    moe_layer_destroy(ga), moe_layer_destroy(gb);
    moe_layer_destroy(c1), moe_layer_destroy(g1), moe_layer_destroy(c2), moe_layer_destroy(g2);
    moe_context_destroy(cpu), moe_context_destroy(gpu);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

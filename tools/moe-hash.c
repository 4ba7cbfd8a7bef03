/*
 * moe-hash: what a layer computes, as hashes, to show that a change moved no bit.
 *
 * For each configuration (bench_layer's shapes, plus fp64 and bf16 variants and one with a gated
 * shared expert and aux/z losses) it runs two training steps (forward + backward, gradients
 * accumulating) on seeded inputs through the public ABI and prints one FNV-1a 64 hash per tensor:
 * y and dx of each step, then the gradient of every parameter slot after both steps.
 *
 *   moe-hash [--threads N] [--config NAME[,NAME...]] [--list]
 *
 * Run it on two builds (the same thread count, the same machine) and diff the outputs: equal lines
 * are bitwise-equal tensors. Only the public ABI is used, so one binary can be built against an
 * older libmoe (issue 22's and 23's before/after hashes).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moe.h>

typedef struct hash_config {
    const char *name;
    int64_t T, H, F, Fs; /* Fs: shared expert hidden size (0: none) */
    int32_t E, K, dtype;
    int losses; /* switch aux loss and z-loss */
} hash_config;

static const hash_config CONFIGS[] = {
    {"target", 4096, 1024, 1024, 0, 16, 2, MOE_DTYPE_FP32, 0},
    {"target_bf16", 4096, 1024, 1024, 0, 16, 2, MOE_DTYPE_BF16, 0},
    {"small", 2048, 512, 512, 0, 8, 2, MOE_DTYPE_FP32, 0},
    {"finegrained", 4096, 1024, 256, 0, 64, 8, MOE_DTYPE_FP32, 0},
    {"small_fp64", 2048, 512, 512, 0, 8, 2, MOE_DTYPE_FP64, 0},
    {"small_bf16", 2048, 512, 512, 0, 8, 2, MOE_DTYPE_BF16, 0},
    {"shared_losses", 1024, 256, 384, 512, 8, 2, MOE_DTYPE_FP32, 1},
    /* narrow experts: where oneDNN splits a weight-gradient GEMM's K over threads (docs/determinism.md) */
    {"narrow", 4096, 64, 32, 0, 16, 2, MOE_DTYPE_FP32, 0},
    /* the CTest smoke run (also under valgrind) */
    {"tiny", 256, 64, 96, 64, 8, 2, MOE_DTYPE_FP32, 1},
};
#define NUM_CONFIGS ((int)(sizeof CONFIGS / sizeof CONFIGS[0]))

static const char *const SLOT_NAMES[MOE_PARAM_NUM_SLOTS] = {"router_weight", "expert_fc1", "expert_fc2",
                                                            "shared_fc1",    "shared_fc2", "shared_gate",
                                                            "expert_bias"};

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static size_t elem_size(int32_t dt) { return dt == MOE_DTYPE_BF16 ? 2 : dt == MOE_DTYPE_FP64 ? 8 : 4; }

/* Uniform [-1, 1) from a 64-bit LCG, stored in dtype dt (bf16: the upper half of the fp32 value). */
static void fill(void *buf, int64_t n, int32_t dt, uint64_t seed)
{
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const double v = (double)(s >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
        if (dt == MOE_DTYPE_FP64) {
            ((double *)buf)[i] = v;
        } else {
            const float f = (float)v;
            if (dt == MOE_DTYPE_FP32) {
                ((float *)buf)[i] = f;
            } else {
                uint32_t u;
                memcpy(&u, &f, sizeof u);
                ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
            }
        }
    }
}

static int check(int32_t rc, const char *what, moe_context *ctx)
{
    if (rc == MOE_OK) return 0;
    char msg[512] = "";
    if (ctx) moe_context_last_error(ctx, msg, sizeof msg);
    fprintf(stderr, "moe-hash: %s failed (%d): %s\n", what, rc, msg);
    return 1;
}

static void tensor2d(DLTensor *t, void *data, int64_t *shape, int32_t dt)
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->device.device_type = kDLCPU;
    t->ndim = 2;
    t->shape = shape;
    t->dtype.code = dt == MOE_DTYPE_BF16 ? kDLBfloat : kDLFloat;
    t->dtype.bits = (uint8_t)(elem_size(dt) * 8);
    t->dtype.lanes = 1;
}

static int run(const hash_config *c, int threads)
{
    moe_context_config cc;
    moe_context *ctx = NULL;
    moe_layer *layer = NULL;
    int bad = check(moe_context_config_init(&cc, sizeof cc), "moe_context_config_init", NULL);
    cc.device_type = MOE_DEVICE_CPU;
    cc.num_threads = threads;
    bad = bad || check(moe_context_create(&cc, &ctx), "moe_context_create", NULL);
    moe_layer_config lc;
    bad = bad || check(moe_layer_config_init(&lc, sizeof lc), "moe_layer_config_init", ctx);
    if (bad) {
        moe_context_destroy(ctx);
        return 1;
    }
    lc.hidden_size = c->H;
    lc.ffn_hidden_size = c->F;
    lc.num_experts = c->E;
    lc.top_k = c->K;
    lc.activation = MOE_ACT_SWIGLU;
    lc.score_function = MOE_SCORE_SOFTMAX;
    lc.param_dtype = c->dtype;
    lc.seed = 1234;
    if (c->Fs > 0) {
        lc.shared_ffn_hidden_size = c->Fs;
        lc.shared_gate = 1;
    }
    if (c->losses) {
        lc.aux_loss_type = MOE_AUX_SWITCH;
        lc.aux_loss_coeff = 0.01f;
        lc.z_loss_coeff = 0.001f;
    }
    bad = check(moe_layer_create(ctx, &lc, &layer), "moe_layer_create", ctx);
    const size_t bytes = (size_t)(c->T * c->H) * elem_size(c->dtype);
    void *x = malloc(bytes), *dy = malloc(bytes), *y = calloc(1, bytes), *dx = calloc(1, bytes);
    if (!x || !dy || !y || !dx) {
        fprintf(stderr, "moe-hash: out of memory\n");
        bad = 1;
    }
    int64_t shape[2] = {c->T, c->H};
    DLTensor tx, tdy, ty, tdx;
    tensor2d(&tx, x, shape, c->dtype), tensor2d(&tdy, dy, shape, c->dtype);
    tensor2d(&ty, y, shape, c->dtype), tensor2d(&tdx, dx, shape, c->dtype);
    moe_step_config sc;
    bad = bad || check(moe_step_config_init(&sc, sizeof sc), "moe_step_config_init", ctx);
    sc.mode = MOE_STEP_TRAIN;
    for (int step = 0; step < 2 && !bad; step++) {
        fill(x, c->T * c->H, c->dtype, 100 + (uint64_t)step);
        fill(dy, c->T * c->H, c->dtype, 200 + (uint64_t)step);
        moe_step *s = NULL;
        bad = check(moe_step_create(layer, &sc, &s), "moe_step_create", ctx);
        bad = bad || check(moe_layer_forward(layer, s, &tx, &ty, NULL), "moe_layer_forward", ctx);
        bad = bad || check(moe_layer_backward(layer, s, &tdy, &tdx, NULL), "moe_layer_backward", ctx);
        moe_step_destroy(s);
        if (!bad) {
            printf("%-14s step%d y      %016llx\n", c->name, step, (unsigned long long)fnv1a(y, bytes));
            printf("%-14s step%d dx     %016llx\n", c->name, step, (unsigned long long)fnv1a(dx, bytes));
        }
    }
    for (int32_t slot = 0; slot < MOE_PARAM_NUM_SLOTS && !bad; slot++) {
        if (slot == MOE_PARAM_EXPERT_BIAS || moe_layer_has_param(layer, slot) != 1) continue;
        DLManagedTensor *m = NULL;
        if (check(moe_layer_grad(layer, slot, &m), "moe_layer_grad", ctx)) {
            bad = 1;
            break;
        }
        size_t n = (size_t)(m->dl_tensor.dtype.bits / 8);
        for (int i = 0; i < m->dl_tensor.ndim; i++) n *= (size_t)m->dl_tensor.shape[i];
        printf("%-14s grad  %-13s %016llx\n", c->name, SLOT_NAMES[slot],
               (unsigned long long)fnv1a((const char *)m->dl_tensor.data + m->dl_tensor.byte_offset, n));
        m->deleter(m);
    }
    free(x), free(dy), free(y), free(dx);
    moe_layer_destroy(layer);
    moe_context_destroy(ctx);
    return bad;
}

int main(int argc, char **argv)
{
    int threads = 2, selected[NUM_CONFIGS], nsel = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
            if (threads < 1) {
                fprintf(stderr, "moe-hash: --threads wants a positive integer\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            char *list = argv[++i];
            for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
                int found = 0;
                for (int c = 0; c < NUM_CONFIGS; c++)
                    if (!strcmp(tok, CONFIGS[c].name) && nsel < NUM_CONFIGS) selected[nsel++] = c, found = 1;
                if (!found) {
                    fprintf(stderr, "moe-hash: unknown config '%s' (--list names them)\n", tok);
                    return 2;
                }
            }
        } else if (!strcmp(argv[i], "--list")) {
            for (int c = 0; c < NUM_CONFIGS; c++)
                printf("%-14s T=%lld H=%lld F=%lld Fs=%lld E=%d K=%d %s%s\n", CONFIGS[c].name, (long long)CONFIGS[c].T,
                       (long long)CONFIGS[c].H, (long long)CONFIGS[c].F, (long long)CONFIGS[c].Fs, CONFIGS[c].E,
                       CONFIGS[c].K,
                       CONFIGS[c].dtype == MOE_DTYPE_BF16   ? "bf16"
                       : CONFIGS[c].dtype == MOE_DTYPE_FP64 ? "fp64"
                                                            : "fp32",
                       CONFIGS[c].losses ? " aux+z losses" : "");
            return 0;
        } else {
            fprintf(stderr, "usage: moe-hash [--threads N] [--config NAME[,NAME...]] [--list]\n");
            return 2;
        }
    }
    if (nsel == 0)
        for (int c = 0; c < NUM_CONFIGS; c++) selected[nsel++] = c;
    printf("moe-hash: libmoe %s, threads=%d\n", moe_version_string(), threads);
    int bad = 0;
    for (int s = 0; s < nsel; s++) bad |= run(&CONFIGS[selected[s]], threads);
    return bad;
}

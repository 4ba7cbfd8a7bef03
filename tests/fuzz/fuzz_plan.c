/*
 * fuzz_plan: the memory planner. moe_plan_estimate with fuzzed model descriptions and layouts
 * (published presets with fields changed, or fields from scratch: typical sizes, odd values, raw
 * bits), and moe_plan_layer_estimate with fuzzed layer configs and token counts.
 *
 * The planner computes from formulas and allocates nothing, so any value may reach it. Checks
 * beyond "no crash, no undefined behaviour": an accepted description gives figures that are
 * non-negative and add up (total_bytes = sum of the categories, fits as documented); an accepted
 * layer estimate gives non-negative peaks whose total covers the weights.
 */
#include "fuzz_common.h"

static int64_t fz_wide(fz *f, int64_t lo, int64_t hi)
{
    uint8_t mode = fz_u8(f);
    if (mode < 216) return fz_range(f, lo, hi);
    if (mode < 240) return fz_odd(f);
    if (mode < 248) return fz_range(f, 0, (int64_t)1 << 40);
    return (int64_t)fz_u64(f);
}

static void model_fields(fz *f, moe_plan_model *m)
{
    m->num_layers = fz_dim32(f, 1, 64);
    m->first_dense_layers = fz_dim32(f, 0, 3);
    m->moe_layer_freq = fz_dim32(f, 0, 2);
    m->num_experts = fz_dim32(f, 0, 256);
    m->top_k = fz_dim32(f, 1, 8);
    m->num_shared_experts = fz_dim32(f, 0, 2);
    m->hidden_size = fz_wide(f, 1, 8192);
    m->ffn_hidden_size = fz_wide(f, 1, 32768);
    m->moe_ffn_hidden_size = fz_wide(f, 1, 4096);
    m->shared_ffn_hidden_size = fz_wide(f, 0, 4096);
    m->vocab_size = fz_wide(f, 1, 200000);
    m->activation = fz_dim32(f, 0, 4);
    m->tied_embeddings = fz_dim32(f, 0, 1);
    m->attention = fz_dim32(f, 0, 1);
    m->num_heads = fz_dim32(f, 1, 128);
    m->num_kv_heads = fz_dim32(f, 0, 16);
    m->head_dim = fz_dim32(f, 0, 256);
    m->q_lora_rank = fz_dim32(f, 0, 1536);
    m->kv_lora_rank = fz_dim32(f, 0, 512);
    m->qk_rope_head_dim = fz_dim32(f, 0, 64);
    m->v_head_dim = fz_dim32(f, 0, 256);
}

static void parallel_fields(fz *f, moe_plan_parallel *p)
{
    p->tp = fz_dim32(f, 0, 8), p->cp = fz_dim32(f, 0, 4), p->dp = fz_dim32(f, 0, 64), p->pp = fz_dim32(f, 0, 8);
    p->vpp = fz_dim32(f, 0, 4), p->ep = fz_dim32(f, 0, 64), p->etp = fz_dim32(f, 0, 4);
    p->micro_batch = fz_dim32(f, 0, 4);
    p->seq_length = fz_wide(f, 1, 32768);
    p->num_micro_batches = fz_dim32(f, 0, 64);
    p->param_bytes = fz_dim32(f, 0, 4), p->grad_bytes = fz_dim32(f, 0, 4);
    p->optimizer_bytes = fz_dim32(f, 0, 16), p->activation_bytes = fz_dim32(f, 0, 4);
    p->distributed_optimizer = fz_dim32(f, 0, 1);
    p->recompute = fz_dim32(f, 0, 2);
    p->offload = fz_dim32(f, 0, 3);
    p->device_memory_bytes = fz_wide(f, 0, (int64_t)1 << 40);
}

/* Changes a few fields of a preset to odd values. */
static void perturb(fz *f, moe_plan_model *m, moe_plan_parallel *p)
{
    int n = fz_u8(f) % 4;
    for (int i = 0; i < n; i++) {
        int64_t v = fz_u8(f) < 128 ? fz_odd(f) : (int64_t)fz_u64(f);
        switch (fz_u8(f) % 24) {
        case 0: m->num_layers = (int32_t)v; break;
        case 1: m->first_dense_layers = (int32_t)v; break;
        case 2: m->moe_layer_freq = (int32_t)v; break;
        case 3: m->num_experts = (int32_t)v; break;
        case 4: m->top_k = (int32_t)v; break;
        case 5: m->hidden_size = v; break;
        case 6: m->ffn_hidden_size = v; break;
        case 7: m->moe_ffn_hidden_size = v; break;
        case 8: m->vocab_size = v; break;
        case 9: m->num_heads = (int32_t)v; break;
        case 10: m->head_dim = (int32_t)v; break;
        case 11: m->kv_lora_rank = (int32_t)v; break;
        case 12: m->num_kv_heads = (int32_t)v; break;
        case 13: p->tp = (int32_t)v; break;
        case 14: p->pp = (int32_t)v; break;
        case 15: p->vpp = (int32_t)v; break;
        case 16: p->ep = (int32_t)v; break;
        case 17: p->dp = (int32_t)v; break;
        case 18: p->seq_length = v; break;
        case 19: p->micro_batch = (int32_t)v; break;
        case 20: p->num_micro_batches = (int32_t)v; break;
        case 21: p->activation_bytes = (int32_t)v; break;
        case 22: p->cp = (int32_t)v; break;
        default: p->device_memory_bytes = v; break;
        }
    }
}

static void run_estimate(fz *f)
{
    moe_plan_model m;
    moe_plan_parallel p;
    FZ_CHECK(moe_plan_model_init(&m, sizeof m) == MOE_OK && moe_plan_parallel_init(&p, sizeof p) == MOE_OK, "init");
    uint8_t how = fz_u8(f);
    if (how < 96) {
        static const char *const names[] = {"deepseek-v3", "qwen3-235b-a22b", "mixtral-8x7b"};
        FZ_CHECK(moe_plan_model_preset(names[how % 3], &m, &p) == MOE_OK, "preset %s", names[how % 3]);
        perturb(f, &m, &p);
    } else {
        model_fields(f, &m);
        parallel_fields(f, &p);
    }
    moe_plan_result r;
    memset(&r, 0xa5, sizeof r);
    r.struct_size = sizeof r;
    int32_t st = moe_plan_estimate(&m, &p, &r);
    fz_check_message(NULL, st, "moe_plan_estimate");
    if (st != MOE_OK) return;
    int64_t sum = 0;
    for (int c = 0; c < MOE_PLAN_NUM_CATEGORIES; c++) {
        FZ_CHECK(r.bytes[c] >= 0, "bytes[%d] = %lld", c, (long long)r.bytes[c]);
        FZ_CHECK(sum <= INT64_MAX - r.bytes[c], "the categories overflow int64");
        sum += r.bytes[c];
    }
    FZ_CHECK(r.total_bytes == sum, "total_bytes %lld != sum %lld", (long long)r.total_bytes, (long long)sum);
    for (int c = 0; c < MOE_PLAN_COMM_NUM; c++) FZ_CHECK(r.comm_bytes[c] >= 0, "comm_bytes[%d] = %lld", c, (long long)r.comm_bytes[c]);
    FZ_CHECK(r.params_total >= 0 && r.params_per_gpu >= 0, "params %lld, per GPU %lld", (long long)r.params_total,
             (long long)r.params_per_gpu);
    FZ_CHECK(r.stage >= 0, "stage %d", r.stage);
    FZ_CHECK(r.device_memory_bytes == p.device_memory_bytes, "device_memory_bytes not as given");
    if (p.device_memory_bytes > 0) FZ_CHECK(r.fits == (r.total_bytes <= p.device_memory_bytes), "fits = %d", r.fits);
    else FZ_CHECK(r.fits == -1, "fits = %d without a device size", r.fits);
}

static void run_layer_estimate(fz *f)
{
    fz_alloc a;
    moe_context *ctx = fz_context(&a, (size_t)1 << 20);
    moe_layer_config c;
    moe_layer_config_init(&c, sizeof c);
    fz_layer_fields(f, &c, 1);
    if (fz_u8(f) >= 160) { /* sizes of real models */
        static const int64_t widths[] = {1024, 2048, 4096, 7168, 8192, 14336, 18432, 1 << 24};
        c.hidden_size = widths[fz_u8(f) % 8];
        c.ffn_hidden_size = widths[fz_u8(f) % 8];
        c.num_experts = (int32_t)fz_range(f, 1, 65536);
        c.top_k = (int32_t)fz_range(f, 1, 16);
    }
    int64_t tokens = fz_wide(f, 0, 65536);
    moe_memory_stats out;
    memset(&out, 0xa5, sizeof out);
    uint32_t sz = fz_u8(f) < 224 ? (uint32_t)sizeof out : (uint32_t)fz_range(f, 0, sizeof out);
    out.struct_size = sz;
    int32_t st = moe_plan_layer_estimate(ctx, &c, tokens, &out);
    fz_check_message(ctx, st, "moe_plan_layer_estimate");
    if (st == MOE_OK) {
        int64_t sum = 0;
        for (int k = 0; k < MOE_MEM_NUM_CATEGORIES; k++) {
            FZ_CHECK(out.peak_bytes[k] >= 0, "peak_bytes[%d] = %lld", k, (long long)out.peak_bytes[k]);
            sum += out.peak_bytes[k] > INT64_MAX - sum ? 0 : out.peak_bytes[k];
        }
        FZ_CHECK(out.total_peak_bytes >= out.peak_bytes[MOE_MEM_WEIGHTS] + out.peak_bytes[MOE_MEM_GRADS] ||
                     out.peak_bytes[MOE_MEM_WEIGHTS] > INT64_MAX - out.peak_bytes[MOE_MEM_GRADS],
                 "total_peak_bytes %lld below weights + grads", (long long)out.total_peak_bytes);
    }
    fz_context_done(ctx, &a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    if (fz_u8(&f) & 1) run_layer_estimate(&f);
    else run_estimate(&f);
    return 0;
}

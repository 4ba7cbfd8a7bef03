/*
 * The memory planner (moe.h "memory planner"): per-GPU memory by category and per-step communication
 * volume of training a model under a parallel layout. Formulas and their sources: docs/planner.md.
 * All sizes are in elements until multiplied by a byte width; "t" is the tokens of one micro-batch
 * on one context-parallel rank (micro_batch * seq_length / cp). The ABI's entry points, which check
 * and copy the host's structs, are api/api_plan.c's; these functions take today's structs.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "base/error.h"
#include "plan/plan.h"

#define PLAN_MAX_LAYERS 65536              /* model.num_layers */
#define PLAN_MAX_WIDTH ((int64_t)1 << 40)  /* hidden, FFN and vocabulary sizes, seq_length */
#define PLAN_MAX_PARALLEL (1 << 20)        /* every parallel size, count and byte width of par */
#define PLAN_MAX_FIGURE 0x1p62             /* bytes / parameters a result field can hold, with room to sum */

/* ---------------------------------------------------------------- presets */
int32_t moe_plan_preset(const char *name, moe_plan_model *model, moe_plan_parallel *par)
{
    moe_plan_model m = *model;
    moe_plan_parallel p = *par;
    if (strcmp(name, "deepseek-v3") == 0) {
        /* DeepSeek-V3 technical report (arXiv 2412.19437) and its config.json; layout: Megatron Core MoE
         * (arXiv 2603.07685), 256 GPUs: PP4 x VPP4 x EP64, TP1, MBS 1, 4096 tokens */
        m.num_layers = 61, m.first_dense_layers = 3, m.num_experts = 256, m.top_k = 8, m.num_shared_experts = 1;
        m.hidden_size = 7168, m.ffn_hidden_size = 18432, m.moe_ffn_hidden_size = 2048, m.vocab_size = 129280;
        m.attention = MOE_PLAN_ATTN_MLA, m.num_heads = 128, m.head_dim = 128, m.q_lora_rank = 1536;
        m.kv_lora_rank = 512, m.qk_rope_head_dim = 64, m.v_head_dim = 128;
        p.tp = 1, p.pp = 4, p.vpp = 4, p.ep = 64, p.dp = 64, p.seq_length = 4096, p.num_micro_batches = 64;
        p.distributed_optimizer = 1; /* Megatron Core's MoE recipes always shard the optimizer */
    } else if (strcmp(name, "qwen3-235b-a22b") == 0) {
        /* Qwen3 technical report (arXiv 2505.09388) and its config.json; layout: 256 GPUs, TP1 x PP8 x EP32,
         * MBS 1, 4096 tokens (a layout of Megatron Core's class for this model; docs/planner.md) */
        m.num_layers = 94, m.num_experts = 128, m.top_k = 8, m.hidden_size = 4096, m.ffn_hidden_size = 12288;
        m.moe_ffn_hidden_size = 1536, m.vocab_size = 151936, m.num_heads = 64, m.num_kv_heads = 4, m.head_dim = 128;
        p.tp = 1, p.pp = 8, p.ep = 32, p.dp = 32, p.seq_length = 4096, p.num_micro_batches = 64;
    } else if (strcmp(name, "mixtral-8x7b") == 0) {
        /* Mixtral of Experts (arXiv 2401.04088) and config.json; layout: 64 GPUs, TP1 x PP4 x EP8 */
        m.num_layers = 32, m.num_experts = 8, m.top_k = 2, m.hidden_size = 4096, m.ffn_hidden_size = 14336;
        m.moe_ffn_hidden_size = 14336, m.vocab_size = 32000, m.num_heads = 32, m.num_kv_heads = 8, m.head_dim = 128;
        p.tp = 1, p.pp = 4, p.ep = 8, p.dp = 16, p.seq_length = 4096, p.num_micro_batches = 32;
    } else {
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_plan_model_preset: unknown preset \"%s\"; expected "
                          "\"deepseek-v3\", \"qwen3-235b-a22b\" or \"mixtral-8x7b\"", name);
    }
    *model = m;
    *par = p;
    return MOE_OK;
}

/* ---------------------------------------------------------------- the estimate */
/* Resolved model and layout. */
typedef struct plan {
    moe_plan_model m;
    moe_plan_parallel p;
    int64_t tp, cp, dp, pp, vpp, ep, etp, edp, mbs, M;
    int64_t pb, gb, ob, d; /* bytes: parameter, gradient, optimizer state, activation */
    int64_t F1, Fm, Fm1, Fs, Fs1, hd, nkv, vd;
    double t, ts; /* tokens of a micro-batch on this CP rank, and their sequence-parallel share */
} plan;

static int is_moe_layer(const plan *P, int64_t l)
{
    const moe_plan_model *m = &P->m;
    if (m->num_experts <= 0 || l < m->first_dense_layers) return 0;
    int64_t freq = m->moe_layer_freq > 0 ? m->moe_layer_freq : 1;
    return (l - m->first_dense_layers) % freq == 0;
}

/* Parameters of layer l on one GPU: dense (replicated over DP x CP) and expert (over EDP). The whole
 * model's count goes to *full. */
static void layer_params(const plan *P, int64_t l, double *dense, double *expert, double *full)
{
    const moe_plan_model *m = &P->m;
    const double H = (double)m->hidden_size, nh = m->num_heads, tp = (double)P->tp;
    double rep = 2 * H, shard = 0; /* two norms; replicated, and TP-sharded parts */
    if (m->attention == MOE_PLAN_ATTN_MLA) {
        const double ql = m->q_lora_rank, kvl = m->kv_lora_rank, rope = m->qk_rope_head_dim;
        if (ql > 0) rep += H * ql + ql, shard += ql * nh * (P->hd + rope);
        else shard += H * nh * (P->hd + rope);
        rep += H * (kvl + rope) + kvl;
        shard += kvl * nh * (P->hd + P->vd) + nh * P->vd * H;
    } else {
        shard += H * nh * P->hd + 2 * H * P->nkv * P->hd + nh * P->hd * H;
    }
    double ex = 0, exfull = 0;
    if (is_moe_layer(P, l)) {
        const double E = m->num_experts;
        rep += E * H; /* router */
        shard += m->num_shared_experts * (H * P->Fs1 + P->Fs * H);
        exfull = E * (H * P->Fm1 + P->Fm * H);
        ex = exfull / (double)(P->ep * P->etp);
    } else {
        shard += H * (double)P->F1 + (double)m->ffn_hidden_size * H;
    }
    *dense = rep + shard / tp;
    *expert = ex;
    *full = rep + shard + exfull;
}

/* Activation bytes layer l keeps for backward per micro-batch (rec: the recompute policy). */
static double layer_acts(const plan *P, int64_t l, int32_t rec)
{
    const moe_plan_model *m = &P->m;
    const double H = (double)m->hidden_size, nh = m->num_heads, tp = (double)P->tp, d = (double)P->d;
    const double t = P->t, ts = P->ts;
    const int sel = rec == MOE_RECOMPUTE_SELECTIVE;
    if (rec == MOE_RECOMPUTE_FULL) return ts * H * d; /* the layer's input */
    double a = ts * H * d;                            /* input of the attention norm (the residual) */
    if (!sel) a += ts * H * d;                        /* its output, the projections' input */
    if (m->attention == MOE_PLAN_ATTN_MLA) {
        const double ql = m->q_lora_rank, kvl = m->kv_lora_rank, rope = m->qk_rope_head_dim;
        if (ql > 0) a += t * ql * d * (sel ? 1 : 2);              /* q down-projection, its norm */
        a += t * (kvl + rope) * d + (sel ? 0 : t * kvl * d);      /* kv down-projection, its norm */
        a += t * nh * (2 * (P->hd + rope) + 2 * P->vd) * d / tp;  /* q, k, v, attention output */
    } else {
        a += t * (nh + 2 * P->nkv) * P->hd * d / tp + t * nh * P->hd * d / tp; /* q, k, v, output */
    }
    a += t * nh * 4 / tp;                       /* softmax statistics (flash attention), fp32 */
    a += ts * H * d + (sel ? 0 : ts * H * d);   /* MLP norm input, output */
    if (is_moe_layer(P, l)) {
        const double E = m->num_experts, K = m->top_k, etp = (double)P->etp;
        const double r = ts * K * etp; /* expert rows on this GPU (ETP gathers its group's tokens) */
        a += ts * E * 4 + ts * K * 4;  /* router logits and probabilities, fp32 */
        a += r * H * d + r * P->Fm1 / etp * d + (sel ? 0 : r * P->Fm / etp * d) + r * H * d; /* in, FC1, act, out */
        a += m->num_shared_experts * (t * P->Fs1 * d / tp + (sel ? 0 : t * P->Fs * d / tp));
    } else {
        a += t * P->F1 * d / tp + (sel ? 0 : t * (double)m->ffn_hidden_size * d / tp);
    }
    return a;
}

static int32_t resolve(const moe_plan_model *min, const moe_plan_parallel *pin, plan *P)
{
    memset(P, 0, sizeof *P);
    P->m = *min;
    P->p = *pin;
    const moe_plan_model *m = &P->m;
    const moe_plan_parallel *p = &P->p;
#define BAD(...) moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_plan_estimate: " __VA_ARGS__)
    /* Bounds far beyond any model, which keep the integer arithmetic below inside int64 (widths and
     * parallel sizes multiply in pairs and triples) and the per-layer loops short. */
    if (m->num_layers <= 0 || m->num_layers > PLAN_MAX_LAYERS)
        return BAD("model.num_layers = %d; expected 1 .. %d", m->num_layers, PLAN_MAX_LAYERS);
    if (m->hidden_size <= 0) return BAD("model.hidden_size = %lld; expected > 0", (long long)m->hidden_size);
    if (m->vocab_size <= 0) return BAD("model.vocab_size = %lld; expected > 0", (long long)m->vocab_size);
    const int64_t widths[] = {m->hidden_size, m->vocab_size, m->ffn_hidden_size, m->moe_ffn_hidden_size,
                              m->shared_ffn_hidden_size, p->seq_length};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i] > PLAN_MAX_WIDTH)
            return BAD("a model width or par.seq_length is %lld; at most 2^40 are supported", (long long)widths[i]);
    if (m->num_heads <= 0) return BAD("model.num_heads = %d; expected > 0", m->num_heads);
    if (m->first_dense_layers < 0 || m->moe_layer_freq < 0 || m->num_experts < 0 || m->num_shared_experts < 0 ||
        m->num_kv_heads < 0 || m->head_dim < 0 || m->q_lora_rank < 0 || m->kv_lora_rank < 0 ||
        m->qk_rope_head_dim < 0 || m->v_head_dim < 0 || m->ffn_hidden_size < 0 || m->moe_ffn_hidden_size < 0 ||
        m->shared_ffn_hidden_size < 0)
        return BAD("a model size is negative");
    if (m->attention != MOE_PLAN_ATTN_GQA && m->attention != MOE_PLAN_ATTN_MLA)
        return BAD("model.attention = %d; expected MOE_PLAN_ATTN_GQA (0) or MOE_PLAN_ATTN_MLA (1)", m->attention);
    if (m->attention == MOE_PLAN_ATTN_MLA && m->kv_lora_rank <= 0) return BAD("MLA needs model.kv_lora_rank > 0");
    if (m->activation < MOE_ACT_SWIGLU || m->activation > MOE_ACT_SILU)
        return BAD("model.activation = %d; expected MOE_ACT_*", m->activation);
    if (m->num_experts > 0 && (m->top_k <= 0 || m->top_k > m->num_experts || m->moe_ffn_hidden_size <= 0))
        return BAD("model with experts needs 1 <= top_k <= num_experts and moe_ffn_hidden_size > 0");
    int64_t dense_layers = 0;
    for (int64_t l = 0; l < m->num_layers; l++) dense_layers += !is_moe_layer(P, l);
    if (dense_layers > 0 && m->ffn_hidden_size <= 0) return BAD("dense layers need model.ffn_hidden_size > 0");
    const int32_t dims[] = {p->tp, p->cp, p->dp, p->pp, p->vpp, p->ep, p->etp, p->micro_batch, p->num_micro_batches,
                            p->param_bytes, p->grad_bytes, p->optimizer_bytes, p->activation_bytes};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i] < 0) return BAD("a parallel size, count or byte width is negative");
        if (dims[i] > PLAN_MAX_PARALLEL)
            return BAD("a parallel size, count or byte width is %d; at most 2^20 are supported", dims[i]);
    }
    P->tp = p->tp ? p->tp : 1, P->cp = p->cp ? p->cp : 1, P->dp = p->dp ? p->dp : 1, P->pp = p->pp ? p->pp : 1;
    P->vpp = p->vpp ? p->vpp : 1, P->ep = p->ep ? p->ep : 1, P->etp = p->etp ? p->etp : 1;
    P->mbs = p->micro_batch ? p->micro_batch : 1, P->M = p->num_micro_batches ? p->num_micro_batches : P->pp;
    P->pb = p->param_bytes ? p->param_bytes : 2, P->gb = p->grad_bytes ? p->grad_bytes : 4;
    P->ob = p->optimizer_bytes ? p->optimizer_bytes : 12, P->d = p->activation_bytes ? p->activation_bytes : 2;
    if (p->seq_length <= 0) return BAD("par.seq_length = %lld; expected > 0", (long long)p->seq_length);
    if (p->recompute < MOE_RECOMPUTE_NONE || p->recompute > MOE_RECOMPUTE_FULL)
        return BAD("par.recompute = %d; expected MOE_RECOMPUTE_*", p->recompute);
    if (p->offload & ~(MOE_OFFLOAD_OPTIMIZER | MOE_OFFLOAD_ACTIVATIONS)) return BAD("par.offload = %d: unknown bits", p->offload);
    if (p->distributed_optimizer != 0 && p->distributed_optimizer != 1)
        return BAD("par.distributed_optimizer = %d; expected 0 or 1", p->distributed_optimizer);
    if (p->device_memory_bytes < 0) return BAD("par.device_memory_bytes is negative");
    if ((P->tp * P->cp * P->dp) % (P->ep * P->etp) != 0)
        return BAD("EP x ETP = %lld does not divide TP x CP x DP = %lld (docs/math.md §8)", (long long)(P->ep * P->etp),
                   (long long)(P->tp * P->cp * P->dp));
    P->edp = P->tp * P->cp * P->dp / (P->ep * P->etp);
    if (m->num_experts > 0 && m->num_experts % P->ep != 0)
        return BAD("EP = %lld does not divide num_experts = %d", (long long)P->ep, m->num_experts);
    if (m->num_layers < P->pp * P->vpp)
        return BAD("num_layers = %d is fewer than PP x VPP = %lld chunks", m->num_layers, (long long)(P->pp * P->vpp));
    if (m->num_heads % P->tp != 0) return BAD("TP = %lld does not divide num_heads = %d", (long long)P->tp, m->num_heads);
#undef BAD
    const int gated = m->activation == MOE_ACT_SWIGLU || m->activation == MOE_ACT_GEGLU;
    P->F1 = (gated ? 2 : 1) * m->ffn_hidden_size;
    P->Fm = m->moe_ffn_hidden_size, P->Fm1 = (gated ? 2 : 1) * P->Fm;
    P->Fs = m->shared_ffn_hidden_size ? m->shared_ffn_hidden_size : P->Fm, P->Fs1 = (gated ? 2 : 1) * P->Fs;
    P->hd = m->head_dim ? m->head_dim : m->hidden_size / m->num_heads;
    P->nkv = m->num_kv_heads ? m->num_kv_heads : m->num_heads;
    P->vd = m->v_head_dim ? m->v_head_dim : P->hd;
    P->t = (double)(P->mbs * p->seq_length) / (double)P->cp;
    P->ts = P->t / (double)P->tp;
    return MOE_OK;
}

/* First layer and layer count of virtual chunk j (chunks of near-equal size, the first ones larger). */
static void chunk_layers(const plan *P, int64_t j, int64_t *first, int64_t *count)
{
    const int64_t n = P->pp * P->vpp, base = P->m.num_layers / n, rem = P->m.num_layers % n;
    *first = j * base + (j < rem ? j : rem);
    *count = base + (j < rem);
}

typedef struct stage_est {
    double bytes[MOE_PLAN_NUM_CATEGORIES];
    double comm[MOE_PLAN_COMM_NUM];
    double params;
} stage_est;

static void estimate_stage(const plan *P, int64_t s, stage_est *o, double *params_total)
{
    const moe_plan_model *m = &P->m;
    const moe_plan_parallel *p = &P->p;
    const double H = (double)m->hidden_size, V = (double)m->vocab_size, tp = (double)P->tp, d = (double)P->d;
    const int first = s == 0, last = s == P->pp - 1;
    memset(o, 0, sizeof *o);
    double dense = 0, expert = 0, acts = 0, acts_max = 0, acts_full_max = 0;
    int64_t moe_layers = 0, layers = 0;
    for (int64_t v = 0; v < P->vpp; v++) {
        int64_t l0, n;
        chunk_layers(P, v * P->pp + s, &l0, &n);
        for (int64_t l = l0; l < l0 + n; l++) {
            double dn, ex, fu;
            layer_params(P, l, &dn, &ex, &fu);
            dense += dn, expert += ex;
            const double a = layer_acts(P, l, p->recompute), af = layer_acts(P, l, MOE_RECOMPUTE_NONE);
            acts += a;
            if (a > acts_max) acts_max = a;
            if (af > acts_full_max) acts_full_max = af;
            moe_layers += is_moe_layer(P, l);
            layers++;
        }
    }
    if (first) dense += V * H / tp;                                          /* embedding */
    if (last) dense += H + ((m->tied_embeddings && P->pp == 1) ? 0 : V * H / tp); /* final norm, output layer */
    if (params_total) {
        double tot = (m->tied_embeddings ? 1 : 2) * V * H + H;
        for (int64_t l = 0; l < m->num_layers; l++) {
            double dn, ex, fu;
            layer_params(P, l, &dn, &ex, &fu);
            tot += fu;
        }
        *params_total = tot;
    }
    o->params = dense + expert;

    /* weights, gradients, optimizer */
    o->bytes[MOE_PLAN_WEIGHTS] = (dense + expert) * (double)P->pb;
    o->bytes[MOE_PLAN_GRADS] = (dense + expert) * (double)P->gb;
    if (!(p->offload & MOE_OFFLOAD_OPTIMIZER)) {
        const double dshard = p->distributed_optimizer ? (double)(P->dp * P->cp) : 1.0;
        const double eshard = p->distributed_optimizer ? (double)P->edp : 1.0;
        o->bytes[MOE_PLAN_OPTIMIZER] = (dense / dshard + expert / eshard) * (double)P->ob;
    }

    /* activations: what this stage holds for backward at the schedule's peak */
    double inflight; /* micro-batches' worth of this stage's activations */
    if (p->offload & MOE_OFFLOAD_ACTIVATIONS) {
        inflight = 1.0 / (double)P->vpp; /* the chunk being computed; the others wait on the host */
    } else if (P->vpp == 1) {
        inflight = (double)((P->pp - s) < P->M ? (P->pp - s) : P->M);
    } else { /* interleaved 1F1B: warm-up chunks of Megatron's schedule, plus the one in flight */
        int64_t chunks = (P->pp - s - 1) * 2 + (P->vpp - 1) * P->pp + 1;
        if (chunks > P->M * P->vpp) chunks = P->M * P->vpp;
        inflight = (double)chunks / (double)P->vpp;
    }
    double a = acts * inflight;
    if (p->recompute == MOE_RECOMPUTE_FULL) a += acts_full_max; /* the layer being recomputed */
    if (last) a += P->ts * H * d * inflight;                     /* the final norm's input */
    o->bytes[MOE_PLAN_ACTIVATIONS] = a;

    /* comm buffers: a MoE layer's dispatch (send + receive), pipeline send + receive, TP gather, CP peer K/V */
    const double K = m->top_k, rows = P->ts * K * (double)P->etp;
    if (moe_layers > 0 && (P->ep > 1 || P->etp > 1)) o->bytes[MOE_PLAN_COMM_BUFFERS] += 2 * rows * H * d;
    if (P->pp > 1) o->bytes[MOE_PLAN_COMM_BUFFERS] += 2 * P->ts * H * d;
    if (P->tp > 1) o->bytes[MOE_PLAN_COMM_BUFFERS] += P->t * H * d;
    const double kv_dims = m->attention == MOE_PLAN_ATTN_MLA
                               ? (double)m->num_heads * ((double)P->hd + m->qk_rope_head_dim + (double)P->vd)
                               : 2.0 * (double)P->nkv * (double)P->hd;
    if (P->cp > 1) o->bytes[MOE_PLAN_COMM_BUFFERS] += P->t * kv_dims / tp * d;

    /* workspace: the activation gradients of the layer in backward; the last stage's logits (fp32 softmax) */
    o->bytes[MOE_PLAN_WORKSPACE] = acts_full_max;
    if (last) o->bytes[MOE_PLAN_WORKSPACE] += P->t * V / tp * (d + 4);

    /* communication per step (bytes this GPU sends) */
    const double M = (double)P->M;
    if (P->ep > 1) o->comm[MOE_PLAN_COMM_EP] = 4.0 * P->ts * K * H * d * (double)(P->ep - 1) / (double)P->ep * moe_layers * M;
    if (P->tp > 1) o->comm[MOE_PLAN_COMM_TP] = 8.0 * P->ts * H * d * (tp - 1) * (double)layers * M;
    if (P->etp > 1) o->comm[MOE_PLAN_COMM_TP] += 2.0 * P->ts * K * H * d * (double)(P->etp - 1) * moe_layers * M;
    if (P->cp > 1) o->comm[MOE_PLAN_COMM_CP] = 3.0 * (double)(P->cp - 1) * P->t * kv_dims / tp * d * (double)layers * M;
    const double ndp = (double)(P->dp * P->cp), nedp = (double)P->edp;
    if (ndp > 1) {
        o->comm[MOE_PLAN_COMM_DP] = p->distributed_optimizer
                                        ? (ndp - 1) / ndp * dense * (double)(P->gb + P->pb)
                                        : 2 * (ndp - 1) / ndp * dense * (double)P->gb;
    }
    if (nedp > 1 && expert > 0) {
        o->comm[MOE_PLAN_COMM_EDP] = p->distributed_optimizer
                                         ? (nedp - 1) / nedp * expert * (double)(P->gb + P->pb)
                                         : 2 * (nedp - 1) / nedp * expert * (double)P->gb;
    }
    if (P->pp > 1) o->comm[MOE_PLAN_COMM_PP] = 2.0 * M * (double)P->vpp * P->ts * H * d;
}

int32_t moe_plan_model_estimate(const moe_plan_model *model, const moe_plan_parallel *par, moe_plan_result *out)
{
    plan P;
    TRY(resolve(model, par, &P));
    stage_est best = {{0}, {0}, 0}, cur;
    double params_total = 0, best_total = -1;
    int64_t best_stage = 0;
    for (int64_t s = 0; s < P.pp; s++) {
        estimate_stage(&P, s, &cur, s == 0 ? &params_total : NULL);
        double tot = 0;
        for (int c = 0; c < MOE_PLAN_NUM_CATEGORIES; c++) tot += cur.bytes[c];
        if (tot > best_total) best_total = tot, best = cur, best_stage = s;
    }
    /* figures beyond what the result's int64 fields hold (a description of no real machine) are
     * refused rather than wrapped */
    double figures[MOE_PLAN_NUM_CATEGORIES + MOE_PLAN_COMM_NUM + 3];
    int nf = 0;
    double total = 0;
    for (int c = 0; c < MOE_PLAN_NUM_CATEGORIES; c++) figures[nf++] = best.bytes[c], total += best.bytes[c];
    for (int c = 0; c < MOE_PLAN_COMM_NUM; c++) figures[nf++] = best.comm[c];
    figures[nf++] = total, figures[nf++] = params_total, figures[nf++] = best.params;
    for (int i = 0; i < nf; i++)
        if (!(figures[i] >= 0 && figures[i] < PLAN_MAX_FIGURE))
            return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_plan_estimate: the estimate reaches %g (bytes or "
                              "parameters), beyond the 2^62 the result holds; check the model and layout sizes",
                              figures[i]);
    moe_plan_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.stage = (int32_t)best_stage;
    for (int c = 0; c < MOE_PLAN_NUM_CATEGORIES; c++) {
        r.bytes[c] = (int64_t)llround(best.bytes[c]);
        r.total_bytes += r.bytes[c];
    }
    for (int c = 0; c < MOE_PLAN_COMM_NUM; c++) r.comm_bytes[c] = (int64_t)llround(best.comm[c]);
    r.device_memory_bytes = P.p.device_memory_bytes;
    r.fits = P.p.device_memory_bytes > 0 ? r.total_bytes <= P.p.device_memory_bytes : -1;
    r.params_total = (int64_t)llround(params_total);
    r.params_per_gpu = (int64_t)llround(best.params);
    *out = r;
    return MOE_OK;
}

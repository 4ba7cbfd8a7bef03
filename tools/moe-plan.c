/*
 * moe-plan: per-GPU memory by category, per-step communication volume and a fit check for a model
 * under a parallel layout (moe.h "memory planner"; docs/planner.md).
 *
 *   moe-plan --preset deepseek-v3 [--tp N --cp N --dp N --pp N --vpp N --ep N --etp N --mbs N --seq N
 *            --micro-batches N --recompute none|selective|full --offload none|optimizer|activations|all
 *            --dist-opt 0|1 --device-gb G]
 *   model overrides: --layers N --hidden N --ffn N --moe-ffn N --experts N --topk N --shared N --vocab N
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: moe-plan [--preset deepseek-v3|qwen3-235b-a22b|mixtral-8x7b] [--tp N] [--cp N] [--dp N] [--pp N]\n"
            "                [--vpp N] [--ep N] [--etp N] [--mbs N] [--seq N] [--micro-batches N]\n"
            "                [--recompute none|selective|full] [--offload none|optimizer|activations|all]\n"
            "                [--dist-opt 0|1] [--device-gb G] [--layers N] [--hidden N] [--ffn N] [--moe-ffn N]\n"
            "                [--experts N] [--topk N] [--shared N] [--vocab N]\n");
}

static int fail(const char *what)
{
    char msg[512];
    moe_last_error(msg, sizeof msg);
    fprintf(stderr, "moe-plan: %s: %s\n", what, msg);
    return 1;
}

int main(int argc, char **argv)
{
    moe_plan_model m;
    moe_plan_parallel p;
    moe_plan_model_init(&m, sizeof m);
    moe_plan_parallel_init(&p, sizeof p);
    const char *preset = "deepseek-v3";
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--preset") == 0 && i + 1 < argc) preset = argv[i + 1];
    if (moe_plan_model_preset(preset, &m, &p) != MOE_OK) return fail("--preset");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return usage(), 0;
        if (i + 1 >= argc) return usage(), 2;
        const char *v = argv[++i];
        long long n = atoll(v);
        if (strcmp(a, "--preset") == 0) continue;
        else if (strcmp(a, "--tp") == 0) p.tp = (int32_t)n;
        else if (strcmp(a, "--cp") == 0) p.cp = (int32_t)n;
        else if (strcmp(a, "--dp") == 0) p.dp = (int32_t)n;
        else if (strcmp(a, "--pp") == 0) p.pp = (int32_t)n;
        else if (strcmp(a, "--vpp") == 0) p.vpp = (int32_t)n;
        else if (strcmp(a, "--ep") == 0) p.ep = (int32_t)n;
        else if (strcmp(a, "--etp") == 0) p.etp = (int32_t)n;
        else if (strcmp(a, "--mbs") == 0) p.micro_batch = (int32_t)n;
        else if (strcmp(a, "--seq") == 0) p.seq_length = n;
        else if (strcmp(a, "--micro-batches") == 0) p.num_micro_batches = (int32_t)n;
        else if (strcmp(a, "--dist-opt") == 0) p.distributed_optimizer = (int32_t)n;
        else if (strcmp(a, "--device-gb") == 0) p.device_memory_bytes = (int64_t)(atof(v) * 1e9);
        else if (strcmp(a, "--layers") == 0) m.num_layers = (int32_t)n;
        else if (strcmp(a, "--hidden") == 0) m.hidden_size = n;
        else if (strcmp(a, "--ffn") == 0) m.ffn_hidden_size = n;
        else if (strcmp(a, "--moe-ffn") == 0) m.moe_ffn_hidden_size = n;
        else if (strcmp(a, "--experts") == 0) m.num_experts = (int32_t)n;
        else if (strcmp(a, "--topk") == 0) m.top_k = (int32_t)n;
        else if (strcmp(a, "--shared") == 0) m.num_shared_experts = (int32_t)n;
        else if (strcmp(a, "--vocab") == 0) m.vocab_size = n;
        else if (strcmp(a, "--recompute") == 0) {
            if (strcmp(v, "none") == 0) p.recompute = MOE_RECOMPUTE_NONE;
            else if (strcmp(v, "selective") == 0) p.recompute = MOE_RECOMPUTE_SELECTIVE;
            else if (strcmp(v, "full") == 0) p.recompute = MOE_RECOMPUTE_FULL;
            else return usage(), 2;
        } else if (strcmp(a, "--offload") == 0) {
            if (strcmp(v, "none") == 0) p.offload = 0;
            else if (strcmp(v, "optimizer") == 0) p.offload = MOE_OFFLOAD_OPTIMIZER;
            else if (strcmp(v, "activations") == 0) p.offload = MOE_OFFLOAD_ACTIVATIONS;
            else if (strcmp(v, "all") == 0) p.offload = MOE_OFFLOAD_OPTIMIZER | MOE_OFFLOAD_ACTIVATIONS;
            else return usage(), 2;
        } else {
            fprintf(stderr, "moe-plan: unknown option %s\n", a);
            return usage(), 2;
        }
    }
    moe_plan_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    if (moe_plan_estimate(&m, &p, &r) != MOE_OK) return fail("estimate");

    const double G = 1e9;
    printf("model %s: %.1f B parameters; layout TP%d CP%d DP%d PP%d VPP%d EP%d ETP%d, MBS %d, seq %lld\n", preset,
           (double)r.params_total / G, p.tp ? p.tp : 1, p.cp ? p.cp : 1, p.dp ? p.dp : 1, p.pp ? p.pp : 1,
           p.vpp ? p.vpp : 1, p.ep ? p.ep : 1, p.etp ? p.etp : 1, p.micro_batch ? p.micro_batch : 1,
           (long long)p.seq_length);
    printf("per GPU of pipeline stage %d (%.2f B parameters):\n", r.stage, (double)r.params_per_gpu / G);
    static const char *cats[] = {"weights", "grads", "optimizer", "activations", "comm buffers", "workspace"};
    for (int c = 0; c < 6; c++) printf("  %-14s %10.2f GB\n", cats[c], (double)r.bytes[c] / G);
    printf("  %-14s %10.2f GB\n", "total", (double)r.total_bytes / G);
    printf("communication per step (sent per GPU):\n");
    static const char *groups[] = {"EP all-to-all", "TP", "CP", "DP grads", "EDP grads", "PP p2p"};
    for (int c = 0; c < 6; c++) printf("  %-14s %10.2f GB\n", groups[c], (double)r.comm_bytes[c] / G);
    if (r.fits < 0) printf("fits: not checked (--device-gb)\n");
    else printf("fits in %.1f GB: %s\n", (double)r.device_memory_bytes / G, r.fits ? "yes" : "no");
    return 0;
}

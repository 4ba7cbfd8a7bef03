/*
 * Introspection (abi/moe.h, "introspection"): what a binding asks instead of reading the header.
 *  - moe_struct_size: every MOE_STRUCT_* kind gives sizeof today and the size of the struct's first
 *    release (the frozen 0.1 / 0.2 layouts of abi_frozen.h); unknown kinds are refused;
 *  - moe_enum_name / moe_enum_value: every constant of abi/moe.h (read from the header's text, so a
 *    constant added later without a name fails here) has its name in exactly one family, name and
 *    value map both ways, counts have no name, bit sets name single bits only; errors name the
 *    argument and leave *value alone;
 *  - moe_routing_stats_init, moe_memory_stats_init, moe_plan_result_init, moe_nonfinite_report_init:
 *    write exactly the size they are given (0.1 sizes included), refuse what the struct_size rules
 *    refuse.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi_frozen.h"
#include "layerutil.h"

static void expect_tls(int32_t st, int32_t want, const char *a, const char *b)
{
    ck_assert_int_eq(st, want);
    char msg[1024];
    moe_last_error(msg, sizeof msg);
    ck_assert_msg(strncmp(msg, moe_status_name(want), strlen(moe_status_name(want))) == 0, "\"%s\"", msg);
    ck_assert_msg(!a || strstr(msg, a), "message \"%s\" lacks \"%s\"", msg, a);
    ck_assert_msg(!b || strstr(msg, b), "message \"%s\" lacks \"%s\"", msg, b);
}

/* ------------------------------------------------------------------ struct sizes */
START_TEST(struct_sizes)
{
    static const struct {
        int32_t kind;
        size_t size, first;
    } want[] = {
        {MOE_STRUCT_CONTEXT_CONFIG, sizeof(moe_context_config), sizeof(moe01_context_config)},
        {MOE_STRUCT_ALLOCATOR, sizeof(moe_allocator), sizeof(moe01_allocator)},
        {MOE_STRUCT_LOGGER, sizeof(moe_logger), sizeof(moe01_logger)},
        {MOE_STRUCT_PROFILER, sizeof(moe_profiler), sizeof(moe01_profiler)},
        {MOE_STRUCT_MEMORY_STATS, sizeof(moe_memory_stats), sizeof(moe01_memory_stats)},
        {MOE_STRUCT_LAYER_CONFIG, sizeof(moe_layer_config), sizeof(moe01_layer_config)},
        {MOE_STRUCT_STEP_CONFIG, sizeof(moe_step_config), sizeof(moe01_step_config)},
        {MOE_STRUCT_ROUTING_STATS, sizeof(moe_routing_stats), sizeof(moe01_routing_stats)},
        {MOE_STRUCT_COMM_CONFIG, sizeof(moe_comm_config), sizeof(moe02_comm_config)},
        {MOE_STRUCT_COMM_HOOKS, sizeof(moe_comm_hooks), sizeof(moe02_comm_hooks)},
        {MOE_STRUCT_LAYOUT_CONFIG, sizeof(moe_layout_config), sizeof(moe02_layout_config)},
        {MOE_STRUCT_PARALLEL_CONFIG, sizeof(moe_parallel_config), sizeof(moe02_parallel_config)},
        {MOE_STRUCT_DISPATCHER_CONFIG, sizeof(moe_dispatcher_config), sizeof(moe02_dispatcher_config)},
        {MOE_STRUCT_PLAN_MODEL, sizeof(moe_plan_model), sizeof(moe02_plan_model)},
        {MOE_STRUCT_PLAN_PARALLEL, sizeof(moe_plan_parallel), sizeof(moe02_plan_parallel)},
        {MOE_STRUCT_PLAN_RESULT, sizeof(moe_plan_result), sizeof(moe02_plan_result)},
        {MOE_STRUCT_NONFINITE_REPORT, sizeof(moe_nonfinite_report), sizeof(moe02_nonfinite_report)},
        {MOE_STRUCT_STATE_ENTRY, sizeof(moe_state_entry), sizeof(moe02_state_entry)},
        {MOE_STRUCT_CHECKPOINT_CONFIG, sizeof(moe_checkpoint_config), sizeof(moe02_checkpoint_config)},
        {MOE_STRUCT_MERGED_STEP, sizeof(moe_merged_step), sizeof(moe02_merged_step)},
    };
    const int n = (int)(sizeof want / sizeof want[0]);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(want[i].kind, i); /* dense from 0 */
        size_t size = 0, first = 0;
        ck_assert_int_eq(moe_struct_size(want[i].kind, &size, &first), MOE_OK);
        ck_assert_msg(size == want[i].size && first == want[i].first, "%s: %zu / %zu, want %zu / %zu",
                      moe_enum_name(MOE_ENUM_STRUCT, i), size, first, want[i].size, want[i].first);
        ck_assert_int_eq(moe_struct_size(want[i].kind, NULL, NULL), MOE_OK);
        ck_assert_int_eq(moe_struct_size(want[i].kind, &size, NULL), MOE_OK);
        ck_assert_ptr_nonnull(moe_enum_name(MOE_ENUM_STRUCT, i));
    }
    ck_assert_ptr_null(moe_enum_name(MOE_ENUM_STRUCT, n));
    const int32_t bad[] = {-1, n, 1000, INT32_MIN};
    for (int i = 0; i < 4; i++) {
        size_t size = 77, first = 78;
        expect_tls(moe_struct_size(bad[i], &size, &first), MOE_ERR_INVALID_ARGUMENT, "moe_struct_size", "kind");
        ck_assert_uint_eq(size, 77);
        ck_assert_uint_eq(first, 78);
    }
}
END_TEST

/* ------------------------------------------------------------------ constant names */
typedef struct known {
    int32_t family;
    const char *name;
    int64_t value;
} known;
#define K_(f, c) {MOE_ENUM_##f, #c, (int64_t)(c)}

/* Every constant with the value the C compiler gives it, by family. */
static const known constants[] = {
    K_(STATUS, MOE_OK), K_(STATUS, MOE_ERR_INVALID_ARGUMENT), K_(STATUS, MOE_ERR_UNSUPPORTED),
    K_(STATUS, MOE_ERR_OUT_OF_MEMORY), K_(STATUS, MOE_ERR_VERSION), K_(STATUS, MOE_ERR_STATE),
    K_(STATUS, MOE_ERR_NONFINITE), K_(STATUS, MOE_ERR_BACKEND), K_(STATUS, MOE_ERR_COMM), K_(STATUS, MOE_ERR_TIMEOUT),
    K_(STATUS, MOE_ERR_CALLBACK), K_(STATUS, MOE_ERR_INTERNAL), K_(STATUS, MOE_ERR_IO),
    K_(FEATURE, MOE_FEATURE_CPU), K_(FEATURE, MOE_FEATURE_OPENMP), K_(FEATURE, MOE_FEATURE_OPENBLAS),
    K_(FEATURE, MOE_FEATURE_ONEDNN), K_(FEATURE, MOE_FEATURE_BF16), K_(FEATURE, MOE_FEATURE_FP64),
    K_(FEATURE, MOE_FEATURE_CUDA), K_(FEATURE, MOE_FEATURE_NCCL), K_(FEATURE, MOE_FEATURE_MPI),
    K_(FEATURE, MOE_FEATURE_FP8),
    K_(LOG_LEVEL, MOE_LOG_ERROR), K_(LOG_LEVEL, MOE_LOG_WARN), K_(LOG_LEVEL, MOE_LOG_INFO), K_(LOG_LEVEL, MOE_LOG_DEBUG),
    K_(DEVICE, MOE_DEVICE_CPU), K_(DEVICE, MOE_DEVICE_CUDA),
    K_(MEM, MOE_MEM_WEIGHTS), K_(MEM, MOE_MEM_GRADS), K_(MEM, MOE_MEM_ACTIVATIONS), K_(MEM, MOE_MEM_WORKSPACE),
    K_(MEM, MOE_MEM_COMM), K_(MEM, MOE_MEM_HOST), K_(MEM, MOE_MEM_OFFLOAD),
    K_(ACTIVATION, MOE_ACT_SWIGLU), K_(ACTIVATION, MOE_ACT_GEGLU), K_(ACTIVATION, MOE_ACT_GELU),
    K_(ACTIVATION, MOE_ACT_RELU), K_(ACTIVATION, MOE_ACT_SILU),
    K_(SCORE, MOE_SCORE_SOFTMAX), K_(SCORE, MOE_SCORE_SOFTMAX_PRE_TOPK), K_(SCORE, MOE_SCORE_SIGMOID),
    K_(SCORE, MOE_SCORE_SQRTSOFTPLUS),
    K_(AUX, MOE_AUX_NONE), K_(AUX, MOE_AUX_SWITCH), K_(AUX, MOE_AUX_SEQUENCE), K_(AUX, MOE_AUX_GLOBAL),
    K_(DROP, MOE_DROP_PROBS), K_(DROP, MOE_DROP_POSITION),
    K_(DTYPE, MOE_DTYPE_FP32), K_(DTYPE, MOE_DTYPE_BF16), K_(DTYPE, MOE_DTYPE_FP64), K_(DTYPE, MOE_DTYPE_INT64),
    K_(NONFINITE, MOE_NONFINITE_REJECT), K_(NONFINITE, MOE_NONFINITE_PROPAGATE),
    K_(GRAPHS, MOE_GRAPHS_AUTO), K_(GRAPHS, MOE_GRAPHS_OFF),
    K_(LAYER_RECOMPUTE, MOE_LAYER_RECOMPUTE_EXPERT_FC1), K_(LAYER_RECOMPUTE, MOE_LAYER_RECOMPUTE_ROUTER),
    K_(LAYER_RECOMPUTE, MOE_LAYER_RECOMPUTE_EXPERT_MLP),
    K_(LAYER_OFFLOAD, MOE_LAYER_OFFLOAD_EXPERT_FC1), K_(LAYER_OFFLOAD, MOE_LAYER_OFFLOAD_EXPERT_INPUT),
    K_(LAYER_OFFLOAD, MOE_LAYER_OFFLOAD_ROUTER), K_(LAYER_OFFLOAD, MOE_LAYER_OFFLOAD_INPUT),
    K_(QUANT, MOE_QUANT_NONE), K_(QUANT, MOE_QUANT_FP8_TENSORWISE), K_(QUANT, MOE_QUANT_FP8_BLOCKWISE),
    K_(QUANT, MOE_QUANT_MXFP8), K_(QUANT, MOE_QUANT_NVFP4),
    K_(LAYER_FP8_STORE, MOE_LAYER_FP8_STORE_EXPERT_FC1), K_(LAYER_FP8_STORE, MOE_LAYER_FP8_STORE_EXPERT_INPUT),
    K_(PARAM, MOE_PARAM_ROUTER_WEIGHT), K_(PARAM, MOE_PARAM_EXPERT_FC1), K_(PARAM, MOE_PARAM_EXPERT_FC2),
    K_(PARAM, MOE_PARAM_SHARED_FC1), K_(PARAM, MOE_PARAM_SHARED_FC2), K_(PARAM, MOE_PARAM_SHARED_GATE),
    K_(PARAM, MOE_PARAM_EXPERT_BIAS),
    K_(GRAD_MODE, MOE_GRAD_ACCUMULATE), K_(GRAD_MODE, MOE_GRAD_OVERWRITE),
    K_(STEP_MODE, MOE_STEP_TRAIN), K_(STEP_MODE, MOE_STEP_EVAL), K_(STEP_MODE, MOE_STEP_RECOMPUTE),
    K_(STEP_FLAG, MOE_STEP_EXPLICIT_AUX_SCALE),
    K_(ROUTING, MOE_ROUTING_EXPERT_INDICES), K_(ROUTING, MOE_ROUTING_PROBS), K_(ROUTING, MOE_ROUTING_TOKENS_PER_EXPERT),
    K_(ROUTING, MOE_ROUTING_KEPT_PER_EXPERT), K_(ROUTING, MOE_ROUTING_DROPPED_MASK),
    K_(COMM, MOE_COMM_SELF), K_(COMM, MOE_COMM_MPI), K_(COMM, MOE_COMM_NCCL), K_(COMM, MOE_COMM_HOOKS),
    K_(GROUP, MOE_GROUP_TP), K_(GROUP, MOE_GROUP_CP), K_(GROUP, MOE_GROUP_DP), K_(GROUP, MOE_GROUP_PP),
    K_(GROUP, MOE_GROUP_ETP), K_(GROUP, MOE_GROUP_EP), K_(GROUP, MOE_GROUP_EDP), K_(GROUP, MOE_GROUP_DP_CP),
    K_(GROUP, MOE_GROUP_TP_CP), K_(GROUP, MOE_GROUP_TP_CP_DP),
    K_(DISPATCHER, MOE_DISPATCHER_ALL_TO_ALL), K_(DISPATCHER, MOE_DISPATCHER_ALL_GATHER),
    K_(COMBINE, MOE_COMBINE_WEIGHTED), K_(COMBINE, MOE_COMBINE_UNWEIGHTED),
    K_(PLAN_ATTN, MOE_PLAN_ATTN_GQA), K_(PLAN_ATTN, MOE_PLAN_ATTN_MLA),
    K_(PLAN_RECOMPUTE, MOE_RECOMPUTE_NONE), K_(PLAN_RECOMPUTE, MOE_RECOMPUTE_SELECTIVE),
    K_(PLAN_RECOMPUTE, MOE_RECOMPUTE_FULL),
    K_(PLAN_OFFLOAD, MOE_OFFLOAD_OPTIMIZER), K_(PLAN_OFFLOAD, MOE_OFFLOAD_ACTIVATIONS),
    K_(PLAN_CATEGORY, MOE_PLAN_WEIGHTS), K_(PLAN_CATEGORY, MOE_PLAN_GRADS), K_(PLAN_CATEGORY, MOE_PLAN_OPTIMIZER),
    K_(PLAN_CATEGORY, MOE_PLAN_ACTIVATIONS), K_(PLAN_CATEGORY, MOE_PLAN_COMM_BUFFERS),
    K_(PLAN_CATEGORY, MOE_PLAN_WORKSPACE),
    K_(PLAN_COMM, MOE_PLAN_COMM_EP), K_(PLAN_COMM, MOE_PLAN_COMM_TP), K_(PLAN_COMM, MOE_PLAN_COMM_CP),
    K_(PLAN_COMM, MOE_PLAN_COMM_DP), K_(PLAN_COMM, MOE_PLAN_COMM_EDP), K_(PLAN_COMM, MOE_PLAN_COMM_PP),
    K_(STRUCT, MOE_STRUCT_CONTEXT_CONFIG), K_(STRUCT, MOE_STRUCT_ALLOCATOR), K_(STRUCT, MOE_STRUCT_LOGGER),
    K_(STRUCT, MOE_STRUCT_PROFILER), K_(STRUCT, MOE_STRUCT_MEMORY_STATS), K_(STRUCT, MOE_STRUCT_LAYER_CONFIG),
    K_(STRUCT, MOE_STRUCT_STEP_CONFIG), K_(STRUCT, MOE_STRUCT_ROUTING_STATS), K_(STRUCT, MOE_STRUCT_COMM_CONFIG),
    K_(STRUCT, MOE_STRUCT_COMM_HOOKS), K_(STRUCT, MOE_STRUCT_LAYOUT_CONFIG), K_(STRUCT, MOE_STRUCT_PARALLEL_CONFIG),
    K_(STRUCT, MOE_STRUCT_DISPATCHER_CONFIG), K_(STRUCT, MOE_STRUCT_PLAN_MODEL), K_(STRUCT, MOE_STRUCT_PLAN_PARALLEL),
    K_(STRUCT, MOE_STRUCT_PLAN_RESULT), K_(STRUCT, MOE_STRUCT_NONFINITE_REPORT), K_(STRUCT, MOE_STRUCT_STATE_ENTRY),
    K_(STRUCT, MOE_STRUCT_CHECKPOINT_CONFIG), K_(STRUCT, MOE_STRUCT_MERGED_STEP),
    K_(MERGED, MOE_MERGED_DEFER_WEIGHT_GRADS), K_(FAMILY, MOE_ENUM_MERGED), K_(COMM, MOE_COMM_MODELED),
    K_(STATE, MOE_STATE_PARAM), K_(STATE, MOE_STATE_GRAD), K_(STATE, MOE_STATE_ACCUMULATOR),
    K_(STATE, MOE_STATE_COMPANION), K_(CHECKPOINT, MOE_CHECKPOINT_GRADS), K_(CHECKPOINT, MOE_CHECKPOINT_CAST),
    K_(CHECKPOINT, MOE_CHECKPOINT_RESET_ACCUMULATORS), K_(FAMILY, MOE_ENUM_STATE), K_(FAMILY, MOE_ENUM_CHECKPOINT),
    K_(NONFINITE_KIND, MOE_NONFINITE_KIND_NONE), K_(NONFINITE_KIND, MOE_NONFINITE_KIND_NAN),
    K_(NONFINITE_KIND, MOE_NONFINITE_KIND_POS_INF), K_(NONFINITE_KIND, MOE_NONFINITE_KIND_NEG_INF),
    K_(FAMILY, MOE_ENUM_FAMILY), K_(FAMILY, MOE_ENUM_STATUS), K_(FAMILY, MOE_ENUM_FEATURE), K_(FAMILY, MOE_ENUM_LOG_LEVEL),
    K_(FAMILY, MOE_ENUM_DEVICE), K_(FAMILY, MOE_ENUM_MEM), K_(FAMILY, MOE_ENUM_ACTIVATION), K_(FAMILY, MOE_ENUM_SCORE),
    K_(FAMILY, MOE_ENUM_AUX), K_(FAMILY, MOE_ENUM_DROP), K_(FAMILY, MOE_ENUM_DTYPE), K_(FAMILY, MOE_ENUM_NONFINITE),
    K_(FAMILY, MOE_ENUM_GRAPHS), K_(FAMILY, MOE_ENUM_LAYER_RECOMPUTE), K_(FAMILY, MOE_ENUM_LAYER_OFFLOAD),
    K_(FAMILY, MOE_ENUM_QUANT), K_(FAMILY, MOE_ENUM_LAYER_FP8_STORE), K_(FAMILY, MOE_ENUM_PARAM),
    K_(FAMILY, MOE_ENUM_GRAD_MODE), K_(FAMILY, MOE_ENUM_STEP_MODE), K_(FAMILY, MOE_ENUM_STEP_FLAG),
    K_(FAMILY, MOE_ENUM_ROUTING), K_(FAMILY, MOE_ENUM_COMM), K_(FAMILY, MOE_ENUM_GROUP), K_(FAMILY, MOE_ENUM_DISPATCHER),
    K_(FAMILY, MOE_ENUM_COMBINE), K_(FAMILY, MOE_ENUM_PLAN_ATTN), K_(FAMILY, MOE_ENUM_PLAN_RECOMPUTE),
    K_(FAMILY, MOE_ENUM_PLAN_OFFLOAD), K_(FAMILY, MOE_ENUM_PLAN_CATEGORY), K_(FAMILY, MOE_ENUM_PLAN_COMM),
    K_(FAMILY, MOE_ENUM_STRUCT), K_(FAMILY, MOE_ENUM_NONFINITE_KIND),
};
#define NUM_KNOWN ((int)(sizeof constants / sizeof constants[0]))

/* Counts and version macros: constants of the header that name no value. */
static const char *const unnamed[] = {"MOE_MEM_NUM_CATEGORIES", "MOE_PARAM_NUM_SLOTS", "MOE_GROUP_NUM",
                                      "MOE_PLAN_NUM_CATEGORIES", "MOE_PLAN_COMM_NUM"};

START_TEST(names_and_values_both_ways)
{
    for (int i = 0; i < NUM_KNOWN; i++) {
        const known *k = &constants[i];
        const char *name = moe_enum_name(k->family, k->value);
        ck_assert_msg(name && strcmp(name, k->name) == 0, "family %d value %lld: name %s, want %s", k->family,
                      (long long)k->value, name ? name : "NULL", k->name);
        int64_t v = -12345;
        ck_assert_int_eq(moe_enum_value(k->family, k->name, &v), MOE_OK);
        ck_assert_int_eq(v, k->value);
    }
    /* the slot names the parameter calls use in their messages */
    ck_assert_str_eq(moe_enum_name(MOE_ENUM_PARAM, MOE_PARAM_SHARED_GATE), "MOE_PARAM_SHARED_GATE");
    /* counts have no name; a dense family ends with NULL; bit sets name single bits only */
    ck_assert_ptr_null(moe_enum_name(MOE_ENUM_PARAM, MOE_PARAM_NUM_SLOTS));
    ck_assert_ptr_null(moe_enum_name(MOE_ENUM_GROUP, MOE_GROUP_NUM));
    ck_assert_ptr_null(moe_enum_name(MOE_ENUM_MEM, 7));
    ck_assert_ptr_null(moe_enum_name(MOE_ENUM_DEVICE, 0));
    ck_assert_ptr_null(moe_enum_name(MOE_ENUM_LAYER_RECOMPUTE, 3));
    ck_assert_ptr_null(moe_enum_name(MOE_ENUM_FEATURE, MOE_FEATURE_CPU | MOE_FEATURE_CUDA));
    ck_assert_ptr_null(moe_enum_name(MOE_ENUM_ACTIVATION, -1));
    ck_assert_ptr_null(moe_enum_name(-1, 0));
    ck_assert_ptr_null(moe_enum_name(MOE_ENUM_MERGED + 1, 0));
    /* the families list themselves, densely from 0 */
    int32_t nfam = 0;
    while (moe_enum_name(MOE_ENUM_FAMILY, nfam)) nfam++;
    ck_assert_int_eq(nfam, MOE_ENUM_MERGED + 1);
    for (int32_t f = 0; f < nfam; f++) { /* and each has constants */
        int n = 0;
        for (int i = 0; i < NUM_KNOWN; i++) n += constants[i].family == f;
        ck_assert_msg(n > 0, "family %s has no constant in the table", moe_enum_name(MOE_ENUM_FAMILY, f));
    }
    /* a name belongs to its own family only */
    int64_t v = 99;
    expect_tls(moe_enum_value(MOE_ENUM_ACTIVATION, "MOE_SCORE_SIGMOID", &v), MOE_ERR_INVALID_ARGUMENT,
               "\"MOE_SCORE_SIGMOID\"", "MOE_ENUM_ACTIVATION");
    ck_assert_int_eq(v, 99);
    expect_tls(moe_enum_value(MOE_ENUM_ACTIVATION, "ACT_GELU", &v), MOE_ERR_INVALID_ARGUMENT, "name", "MOE_ACT_SWIGLU");
    expect_tls(moe_enum_value(MOE_ENUM_PARAM, "MOE_PARAM_NUM_SLOTS", &v), MOE_ERR_INVALID_ARGUMENT, "name", NULL);
    expect_tls(moe_enum_value(77, "MOE_ACT_GELU", &v), MOE_ERR_INVALID_ARGUMENT, "family = 77", NULL);
    expect_tls(moe_enum_value(MOE_ENUM_ACTIVATION, NULL, &v), MOE_ERR_INVALID_ARGUMENT, "name is NULL", NULL);
    expect_tls(moe_enum_value(MOE_ENUM_ACTIVATION, "MOE_ACT_GELU", NULL), MOE_ERR_INVALID_ARGUMENT, "value is NULL",
               NULL);
    ck_assert_int_eq(v, 99);
}
END_TEST

/* Every MOE_* constant the header defines (enum members "MOE_X =" and "#define MOE_FEATURE_X"), read
 * from abi/moe.h's text: each must have a name in some family (or be a count). */
START_TEST(every_header_constant_has_a_name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s", __FILE__); /* .../tests/unit/test_introspect.c */
    char *cut = strstr(path, "tests/unit/");
    ck_assert_ptr_nonnull(cut);
    snprintf(cut, sizeof path - (size_t)(cut - path), "abi/moe.h");
    FILE *fp = fopen(path, "r");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    char line[1024];
    int found = 0, in_comment = 0;
    while (fgets(line, sizeof line, fp)) {
        /* drop comments (the header's comments mention constants with "=" too) */
        char code[1024];
        size_t n = 0;
        for (const char *p = line; *p; p++) {
            if (in_comment) {
                if (p[0] == '*' && p[1] == '/') in_comment = 0, p++;
                continue;
            }
            if (p[0] == '/' && p[1] == '*') {
                in_comment = 1, p++;
                continue;
            }
            code[n++] = *p;
        }
        code[n] = 0;
        const int define = strncmp(code, "#define MOE_FEATURE_", 20) == 0;
        for (char *p = code; (p = strstr(p, "MOE_")) != NULL;) {
            char name[128];
            size_t len = 0;
            while (len + 1 < sizeof name && (isupper((unsigned char)p[len]) || isdigit((unsigned char)p[len]) || p[len] == '_'))
                name[len] = p[len], len++;
            name[len] = 0;
            const char *after = p + len;
            while (*after == ' ') after++;
            p += len;
            if (!((after[0] == '=' && after[1] != '=') || (define && strncmp(code + 8, name, len) == 0))) continue;
            int skip = 0;
            for (size_t u = 0; u < sizeof unnamed / sizeof unnamed[0]; u++) skip |= strcmp(unnamed[u], name) == 0;
            if (skip) continue;
            found++;
            int families_with_it = 0;
            for (int32_t f = 0; moe_enum_name(MOE_ENUM_FAMILY, f); f++) {
                int64_t v;
                if (moe_enum_value(f, name, &v) == MOE_OK) families_with_it++;
            }
            ck_assert_msg(families_with_it == 1, "%s: named in %d families, want 1", name, families_with_it);
            int listed = 0;
            for (int i = 0; i < NUM_KNOWN; i++) listed |= strcmp(constants[i].name, name) == 0;
            ck_assert_msg(listed, "%s is missing from this test's table", name);
        }
    }
    fclose(fp);
    ck_assert_int_eq(found, NUM_KNOWN); /* and the table holds nothing the header lacks */
}
END_TEST

/* ------------------------------------------------------------------ *_init of the output structs */
typedef int32_t (*init_fn)(void *p, size_t n);
static int32_t rs_init(void *p, size_t n) { return moe_routing_stats_init(p, n); }
static int32_t ms_init(void *p, size_t n) { return moe_memory_stats_init(p, n); }
static int32_t pr_init(void *p, size_t n) { return moe_plan_result_init(p, n); }
static int32_t nr_init(void *p, size_t n) { return moe_nonfinite_report_init(p, n); }

static void output_init(const char *name, init_fn fn, size_t first, size_t now)
{
    const size_t sizes[] = {first, now, now + 16};
    for (int i = 0; i < 3; i++) {
        unsigned char buf[512];
        memset(buf, 0xA5, sizeof buf);
        ck_assert_int_eq(fn(buf, sizes[i]), MOE_OK);
        uint32_t s;
        memcpy(&s, buf, sizeof s);
        ck_assert_uint_eq(s, sizes[i]);
        for (size_t j = 4; j < sizes[i]; j++) ck_assert_uint_eq(buf[j], 0);
        for (size_t j = sizes[i]; j < sizeof buf; j++) ck_assert_uint_eq(buf[j], 0xA5);
    }
    unsigned char buf[512];
    memset(buf, 0xA5, sizeof buf);
    expect_tls(fn(buf, first - 8), MOE_ERR_VERSION, name, "struct_size");
    if (first < now) expect_tls(fn(buf, first + 4), MOE_ERR_VERSION, name, "struct_size"); /* inside a field */
    for (size_t j = 0; j < sizeof buf; j++) ck_assert_uint_eq(buf[j], 0xA5);
    expect_tls(fn(NULL, now), MOE_ERR_INVALID_ARGUMENT, name, "NULL");
}

START_TEST(output_struct_inits)
{
    output_init("moe_routing_stats_init", rs_init, sizeof(moe01_routing_stats), sizeof(moe_routing_stats));
    output_init("moe_memory_stats_init", ms_init, sizeof(moe01_memory_stats), sizeof(moe_memory_stats));
    output_init("moe_plan_result_init", pr_init, sizeof(moe02_plan_result), sizeof(moe_plan_result));
    output_init("moe_nonfinite_report_init", nr_init, sizeof(moe02_nonfinite_report), sizeof(moe_nonfinite_report));
    /* an initialised routing stats struct is what moe_step_routing_stats takes */
    moe_layer_config c = lu_config(8, 8, 4, 2);
    lu_layer l;
    lu_create(&l, &c, 1);
    float x[3 * 8] = {0}, y[3 * 8];
    moe_step *s = lu_forward(&l, MOE_STEP_EVAL, x, y, 3);
    moe_routing_stats rs;
    ck_assert_int_eq(moe_routing_stats_init(&rs, sizeof rs), MOE_OK);
    ck_assert_int_eq(moe_step_routing_stats(s, &rs), MOE_OK);
    ck_assert_int_eq(rs.num_tokens, 3);
    moe_step_destroy(s);
    lu_destroy(&l);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("introspect");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, struct_sizes);
    tcase_add_test(tc, names_and_values_both_ways);
    tcase_add_test(tc, every_header_constant_has_a_name);
    tcase_add_test(tc, output_struct_inits);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}

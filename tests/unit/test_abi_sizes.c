/*
 * The struct_size contract (docs/abi.md, "Config structs"): structs of every released layout are
 * accepted and filled, with the frozen 0.1 and 0.2 copies of tests/unit/abi_frozen.h.
 *
 *  - today's abi/moe.h keeps every frozen field at its offset and size (append-only);
 *  - *_init writes exactly the size it is given (0.1 and 0.2 sizes; bytes after it stay untouched);
 *  - create / copy accepts a 0.1-sized input (in memory of exactly that size: ASan / valgrind catch a
 *    read past it) and the missing fields take their defaults;
 *  - outputs (moe_layer_get_config, moe_step_routing_stats, moe_context_memory_stats,
 *    moe_step_memory_stats, moe_plan_layer_estimate, moe_plan_estimate, moe_layer_check_gradients) write
 *    at most the caller's
 *    struct_size and set struct_size to the bytes written;
 *  - a struct_size between two releases is accepted when it ends after a whole field and rejected
 *    (MOE_ERR_VERSION, naming the field) when it ends inside one;
 *  - a larger struct (a newer host) is accepted when its extra bytes are zero; a non-zero byte there,
 *    a size above 64 KiB or below the first release fails with MOE_ERR_VERSION;
 *  - a failed call writes nothing.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi_frozen.h"
#include "layerutil.h"

#define GUARD 0xA5
#define GUARD_BYTES 64

enum { H = 8, F = 16, E = 4, K = 2, T = 8 };

/* ------------------------------------------------------------------ helpers */
static void expect_msg(const moe_context *ctx, int32_t status, const char *a, const char *b)
{
    char msg[1024];
    moe_context_last_error(ctx, msg, sizeof msg);
    ck_assert_msg(strncmp(msg, moe_status_name(status), strlen(moe_status_name(status))) == 0,
                  "message \"%s\" does not begin with %s", msg, moe_status_name(status));
    ck_assert_msg(!a || strstr(msg, a), "message \"%s\" lacks \"%s\"", msg, a);
    ck_assert_msg(!b || strstr(msg, b), "message \"%s\" lacks \"%s\"", msg, b);
}

/* A heap block of exactly n bytes (so that a read past it is caught by ASan / valgrind). */
static void *exact(size_t n)
{
    void *p = malloc(n);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Output buffer: n bytes of struct (struct_size = n, rest zero) then GUARD_BYTES of GUARD. */
static unsigned char *out_buf(uint32_t n)
{
    unsigned char *b = exact((size_t)n + GUARD_BYTES);
    memset(b, 0, n);
    memset(b + n, GUARD, GUARD_BYTES);
    memcpy(b, &n, sizeof n);
    return b;
}

static void guard_intact(const unsigned char *b, size_t n, const char *what)
{
    for (size_t i = 0; i < GUARD_BYTES; i++)
        ck_assert_msg(b[n + i] == GUARD, "%s: byte %zu past the caller's %zu bytes was written", what, n + i, n);
}

static uint32_t struct_size_of(const void *p)
{
    uint32_t s;
    memcpy(&s, p, sizeof s);
    return s;
}

static lu_layer make_layer(void)
{
    lu_layer l;
    moe_layer_config c = lu_config(H, F, E, K);
    c.aux_loss_type = MOE_AUX_SWITCH;
    c.aux_loss_coeff = 0.01f;
    lu_create(&l, &c, 1);
    return l;
}

static moe_step *forward_step(lu_layer *l)
{
    static float x[T * H], y[T * H];
    tu_fill_uniform_f(x, T * H, 7, -1, 1);
    return lu_forward(l, MOE_STEP_TRAIN, x, y, T);
}

/* ------------------------------------------------------------------ frozen layouts are prefixes */
#define SAME(OLD, NEW, f)                                                                                        \
    do {                                                                                                         \
        ck_assert_msg(offsetof(OLD, f) == offsetof(NEW, f), #NEW "." #f ": offset %zu, frozen " #OLD " %zu",       \
                      offsetof(NEW, f), offsetof(OLD, f));                                                       \
        ck_assert_msg(sizeof(((OLD *)0)->f) == sizeof(((NEW *)0)->f), #NEW "." #f ": size changed");             \
    } while (0)
#define GROWS(OLD, NEW) ck_assert_msg(sizeof(NEW) >= sizeof(OLD), #NEW " is smaller than frozen " #OLD)

START_TEST(frozen_layouts_are_prefixes_of_today)
{
    /* 0.1 */
    GROWS(moe01_allocator, moe_allocator);
    SAME(moe01_allocator, moe_allocator, struct_size); SAME(moe01_allocator, moe_allocator, reserved);
    SAME(moe01_allocator, moe_allocator, user_data); SAME(moe01_allocator, moe_allocator, alloc);
    SAME(moe01_allocator, moe_allocator, free); SAME(moe01_allocator, moe_allocator, release);
    GROWS(moe01_logger, moe_logger);
    SAME(moe01_logger, moe_logger, struct_size); SAME(moe01_logger, moe_logger, max_level);
    SAME(moe01_logger, moe_logger, user_data); SAME(moe01_logger, moe_logger, log);
    SAME(moe01_logger, moe_logger, release);
    GROWS(moe01_profiler, moe_profiler);
    SAME(moe01_profiler, moe_profiler, struct_size); SAME(moe01_profiler, moe_profiler, user_data);
    SAME(moe01_profiler, moe_profiler, range_push); SAME(moe01_profiler, moe_profiler, range_pop);
    SAME(moe01_profiler, moe_profiler, release);
    GROWS(moe01_context_config, moe_context_config);
    SAME(moe01_context_config, moe_context_config, struct_size); SAME(moe01_context_config, moe_context_config, api_version);
    SAME(moe01_context_config, moe_context_config, next); SAME(moe01_context_config, moe_context_config, device_type);
    SAME(moe01_context_config, moe_context_config, device_id); SAME(moe01_context_config, moe_context_config, num_threads);
    SAME(moe01_context_config, moe_context_config, reserved0); SAME(moe01_context_config, moe_context_config, allocator);
    SAME(moe01_context_config, moe_context_config, logger); SAME(moe01_context_config, moe_context_config, profiler);
    GROWS(moe01_memory_stats, moe_memory_stats);
    SAME(moe01_memory_stats, moe_memory_stats, struct_size); SAME(moe01_memory_stats, moe_memory_stats, current_bytes);
    SAME(moe01_memory_stats, moe_memory_stats, peak_bytes); SAME(moe01_memory_stats, moe_memory_stats, total_current_bytes);
    SAME(moe01_memory_stats, moe_memory_stats, total_peak_bytes); SAME(moe01_memory_stats, moe_memory_stats, num_allocations);
    GROWS(moe01_layer_config, moe_layer_config);
    SAME(moe01_layer_config, moe_layer_config, struct_size); SAME(moe01_layer_config, moe_layer_config, api_version);
    SAME(moe01_layer_config, moe_layer_config, next); SAME(moe01_layer_config, moe_layer_config, hidden_size);
    SAME(moe01_layer_config, moe_layer_config, ffn_hidden_size); SAME(moe01_layer_config, moe_layer_config, num_experts);
    SAME(moe01_layer_config, moe_layer_config, top_k); SAME(moe01_layer_config, moe_layer_config, activation);
    SAME(moe01_layer_config, moe_layer_config, score_function); SAME(moe01_layer_config, moe_layer_config, num_groups);
    SAME(moe01_layer_config, moe_layer_config, group_topk); SAME(moe01_layer_config, moe_layer_config, scaling_factor);
    SAME(moe01_layer_config, moe_layer_config, expert_bias); SAME(moe01_layer_config, moe_layer_config, bias_update_rate);
    SAME(moe01_layer_config, moe_layer_config, aux_loss_type); SAME(moe01_layer_config, moe_layer_config, aux_loss_coeff);
    SAME(moe01_layer_config, moe_layer_config, seq_length); SAME(moe01_layer_config, moe_layer_config, z_loss_coeff);
    SAME(moe01_layer_config, moe_layer_config, capacity_factor); SAME(moe01_layer_config, moe_layer_config, drop_policy);
    SAME(moe01_layer_config, moe_layer_config, pad_to_capacity);
    SAME(moe01_layer_config, moe_layer_config, shared_ffn_hidden_size);
    SAME(moe01_layer_config, moe_layer_config, shared_gate); SAME(moe01_layer_config, moe_layer_config, param_dtype);
    SAME(moe01_layer_config, moe_layer_config, nonfinite_policy); SAME(moe01_layer_config, moe_layer_config, reserved0);
    SAME(moe01_layer_config, moe_layer_config, seed);
    GROWS(moe01_step_config, moe_step_config);
    SAME(moe01_step_config, moe_step_config, struct_size); SAME(moe01_step_config, moe_step_config, api_version);
    SAME(moe01_step_config, moe_step_config, next); SAME(moe01_step_config, moe_step_config, mode);
    SAME(moe01_step_config, moe_step_config, aux_loss_scale);
    GROWS(moe01_routing_stats, moe_routing_stats);
    SAME(moe01_routing_stats, moe_routing_stats, struct_size); SAME(moe01_routing_stats, moe_routing_stats, num_tokens);
    SAME(moe01_routing_stats, moe_routing_stats, num_assignments); SAME(moe01_routing_stats, moe_routing_stats, dropped);
    SAME(moe01_routing_stats, moe_routing_stats, padded_rows); SAME(moe01_routing_stats, moe_routing_stats, capacity);
    SAME(moe01_routing_stats, moe_routing_stats, aux_loss); SAME(moe01_routing_stats, moe_routing_stats, z_loss);

    /* 0.2: what 0.1 had (above) plus these */
    GROWS(moe02_memory_stats, moe_memory_stats);
    SAME(moe02_memory_stats, moe_memory_stats, cached_bytes); SAME(moe02_memory_stats, moe_memory_stats, reserved_bytes);
    SAME(moe02_memory_stats, moe_memory_stats, peak_reserved_bytes);
    SAME(moe02_memory_stats, moe_memory_stats, device_allocations); SAME(moe02_memory_stats, moe_memory_stats, trims);
    GROWS(moe02_layer_config, moe_layer_config);
    SAME(moe02_layer_config, moe_layer_config, graphs); SAME(moe02_layer_config, moe_layer_config, recompute);
    SAME(moe02_layer_config, moe_layer_config, offload); SAME(moe02_layer_config, moe_layer_config, quant_recipe);
    SAME(moe02_layer_config, moe_layer_config, fp8_storage); SAME(moe02_layer_config, moe_layer_config, reserved3);
    GROWS(moe02_step_config, moe_step_config);
    SAME(moe02_step_config, moe_step_config, flags); SAME(moe02_step_config, moe_step_config, reserved0);
    GROWS(moe02_routing_stats, moe_routing_stats);
    SAME(moe02_routing_stats, moe_routing_stats, quant_saturated);
    GROWS(moe02_comm_config, moe_comm_config);
    SAME(moe02_comm_config, moe_comm_config, struct_size); SAME(moe02_comm_config, moe_comm_config, next);
    SAME(moe02_comm_config, moe_comm_config, timeout_ms); SAME(moe02_comm_config, moe_comm_config, reserved0);
    GROWS(moe02_comm_hooks, moe_comm_hooks);
    SAME(moe02_comm_hooks, moe_comm_hooks, struct_size); SAME(moe02_comm_hooks, moe_comm_hooks, rank);
    SAME(moe02_comm_hooks, moe_comm_hooks, size); SAME(moe02_comm_hooks, moe_comm_hooks, reserved0);
    SAME(moe02_comm_hooks, moe_comm_hooks, user_data); SAME(moe02_comm_hooks, moe_comm_hooks, all_to_all_v);
    SAME(moe02_comm_hooks, moe_comm_hooks, all_gather_v); SAME(moe02_comm_hooks, moe_comm_hooks, all_reduce);
    SAME(moe02_comm_hooks, moe_comm_hooks, broadcast); SAME(moe02_comm_hooks, moe_comm_hooks, barrier);
    SAME(moe02_comm_hooks, moe_comm_hooks, release);
    GROWS(moe02_layout_config, moe_layout_config);
    SAME(moe02_layout_config, moe_layout_config, next); SAME(moe02_layout_config, moe_layout_config, world_size);
    SAME(moe02_layout_config, moe_layout_config, tp); SAME(moe02_layout_config, moe_layout_config, cp);
    SAME(moe02_layout_config, moe_layout_config, dp); SAME(moe02_layout_config, moe_layout_config, pp);
    SAME(moe02_layout_config, moe_layout_config, etp); SAME(moe02_layout_config, moe_layout_config, ep);
    SAME(moe02_layout_config, moe_layout_config, order);
    GROWS(moe02_parallel_config, moe_parallel_config);
    SAME(moe02_parallel_config, moe_parallel_config, ep_comm); SAME(moe02_parallel_config, moe_parallel_config, etp_comm);
    SAME(moe02_parallel_config, moe_parallel_config, aux_comm); SAME(moe02_parallel_config, moe_parallel_config, edp_comm);
    SAME(moe02_parallel_config, moe_parallel_config, dp_comm); SAME(moe02_parallel_config, moe_parallel_config, bias_comm);
    SAME(moe02_parallel_config, moe_parallel_config, dispatcher);
    SAME(moe02_parallel_config, moe_parallel_config, num_chunks);
    GROWS(moe02_dispatcher_config, moe_dispatcher_config);
    SAME(moe02_dispatcher_config, moe_dispatcher_config, kind); SAME(moe02_dispatcher_config, moe_dispatcher_config, dtype);
    SAME(moe02_dispatcher_config, moe_dispatcher_config, hidden);
    SAME(moe02_dispatcher_config, moe_dispatcher_config, num_experts);
    SAME(moe02_dispatcher_config, moe_dispatcher_config, top_k);
    SAME(moe02_dispatcher_config, moe_dispatcher_config, capacity_factor);
    SAME(moe02_dispatcher_config, moe_dispatcher_config, drop_policy);
    SAME(moe02_dispatcher_config, moe_dispatcher_config, pad_to_capacity);
    SAME(moe02_dispatcher_config, moe_dispatcher_config, combine);
    SAME(moe02_dispatcher_config, moe_dispatcher_config, reserved0);
    GROWS(moe02_plan_model, moe_plan_model);
    SAME(moe02_plan_model, moe_plan_model, num_layers); SAME(moe02_plan_model, moe_plan_model, first_dense_layers);
    SAME(moe02_plan_model, moe_plan_model, moe_layer_freq); SAME(moe02_plan_model, moe_plan_model, num_experts);
    SAME(moe02_plan_model, moe_plan_model, top_k); SAME(moe02_plan_model, moe_plan_model, num_shared_experts);
    SAME(moe02_plan_model, moe_plan_model, hidden_size); SAME(moe02_plan_model, moe_plan_model, ffn_hidden_size);
    SAME(moe02_plan_model, moe_plan_model, moe_ffn_hidden_size);
    SAME(moe02_plan_model, moe_plan_model, shared_ffn_hidden_size); SAME(moe02_plan_model, moe_plan_model, vocab_size);
    SAME(moe02_plan_model, moe_plan_model, activation); SAME(moe02_plan_model, moe_plan_model, tied_embeddings);
    SAME(moe02_plan_model, moe_plan_model, attention); SAME(moe02_plan_model, moe_plan_model, num_heads);
    SAME(moe02_plan_model, moe_plan_model, num_kv_heads); SAME(moe02_plan_model, moe_plan_model, head_dim);
    SAME(moe02_plan_model, moe_plan_model, q_lora_rank); SAME(moe02_plan_model, moe_plan_model, kv_lora_rank);
    SAME(moe02_plan_model, moe_plan_model, qk_rope_head_dim); SAME(moe02_plan_model, moe_plan_model, v_head_dim);
    GROWS(moe02_plan_parallel, moe_plan_parallel);
    SAME(moe02_plan_parallel, moe_plan_parallel, tp); SAME(moe02_plan_parallel, moe_plan_parallel, cp);
    SAME(moe02_plan_parallel, moe_plan_parallel, dp); SAME(moe02_plan_parallel, moe_plan_parallel, pp);
    SAME(moe02_plan_parallel, moe_plan_parallel, vpp); SAME(moe02_plan_parallel, moe_plan_parallel, ep);
    SAME(moe02_plan_parallel, moe_plan_parallel, etp); SAME(moe02_plan_parallel, moe_plan_parallel, micro_batch);
    SAME(moe02_plan_parallel, moe_plan_parallel, seq_length);
    SAME(moe02_plan_parallel, moe_plan_parallel, num_micro_batches);
    SAME(moe02_plan_parallel, moe_plan_parallel, param_bytes); SAME(moe02_plan_parallel, moe_plan_parallel, grad_bytes);
    SAME(moe02_plan_parallel, moe_plan_parallel, optimizer_bytes);
    SAME(moe02_plan_parallel, moe_plan_parallel, activation_bytes);
    SAME(moe02_plan_parallel, moe_plan_parallel, distributed_optimizer);
    SAME(moe02_plan_parallel, moe_plan_parallel, recompute); SAME(moe02_plan_parallel, moe_plan_parallel, offload);
    SAME(moe02_plan_parallel, moe_plan_parallel, device_memory_bytes);
    GROWS(moe02_plan_result, moe_plan_result);
    SAME(moe02_plan_result, moe_plan_result, struct_size); SAME(moe02_plan_result, moe_plan_result, stage);
    SAME(moe02_plan_result, moe_plan_result, bytes); SAME(moe02_plan_result, moe_plan_result, total_bytes);
    SAME(moe02_plan_result, moe_plan_result, device_memory_bytes); SAME(moe02_plan_result, moe_plan_result, fits);
    SAME(moe02_plan_result, moe_plan_result, comm_bytes); SAME(moe02_plan_result, moe_plan_result, params_total);
    SAME(moe02_plan_result, moe_plan_result, params_per_gpu);
    GROWS(moe02_nonfinite_report, moe_nonfinite_report);
    SAME(moe02_nonfinite_report, moe_nonfinite_report, struct_size);
    SAME(moe02_nonfinite_report, moe_nonfinite_report, first_slot);
    SAME(moe02_nonfinite_report, moe_nonfinite_report, num_nonfinite);
    SAME(moe02_nonfinite_report, moe_nonfinite_report, num_nan);
    SAME(moe02_nonfinite_report, moe_nonfinite_report, num_experts);
    SAME(moe02_nonfinite_report, moe_nonfinite_report, num_slots);
    SAME(moe02_nonfinite_report, moe_nonfinite_report, first_expert);
    SAME(moe02_nonfinite_report, moe_nonfinite_report, first_kind);
    SAME(moe02_nonfinite_report, moe_nonfinite_report, first_index);
    GROWS(moe02_state_entry, moe_state_entry);
    SAME(moe02_state_entry, moe_state_entry, struct_size); SAME(moe02_state_entry, moe_state_entry, kind);
    SAME(moe02_state_entry, moe_state_entry, slot); SAME(moe02_state_entry, moe_state_entry, dtype);
    SAME(moe02_state_entry, moe_state_entry, ndim); SAME(moe02_state_entry, moe_state_entry, view_ndim);
    SAME(moe02_state_entry, moe_state_entry, shape); SAME(moe02_state_entry, moe_state_entry, view_shape);
    SAME(moe02_state_entry, moe_state_entry, offset); SAME(moe02_state_entry, moe_state_entry, length);
    SAME(moe02_state_entry, moe_state_entry, name);
    GROWS(moe02_checkpoint_config, moe_checkpoint_config);
    SAME(moe02_checkpoint_config, moe_checkpoint_config, struct_size);
    SAME(moe02_checkpoint_config, moe_checkpoint_config, api_version);
    SAME(moe02_checkpoint_config, moe_checkpoint_config, next); SAME(moe02_checkpoint_config, moe_checkpoint_config, dir);
    SAME(moe02_checkpoint_config, moe_checkpoint_config, name); SAME(moe02_checkpoint_config, moe_checkpoint_config, comm);
    SAME(moe02_checkpoint_config, moe_checkpoint_config, flags);
    SAME(moe02_checkpoint_config, moe_checkpoint_config, reserved0);
    GROWS(moe02_merged_step, moe_merged_step);
    SAME(moe02_merged_step, moe_merged_step, struct_size); SAME(moe02_merged_step, moe_merged_step, api_version);
    SAME(moe02_merged_step, moe_merged_step, next); SAME(moe02_merged_step, moe_merged_step, forward_step);
    SAME(moe02_merged_step, moe_merged_step, x); SAME(moe02_merged_step, moe_merged_step, y);
    SAME(moe02_merged_step, moe_merged_step, backward_step); SAME(moe02_merged_step, moe_merged_step, dy);
    SAME(moe02_merged_step, moe_merged_step, dx); SAME(moe02_merged_step, moe_merged_step, weights_step);
    SAME(moe02_merged_step, moe_merged_step, flags); SAME(moe02_merged_step, moe_merged_step, reserved0);
}
END_TEST

/* ------------------------------------------------------------------ *_init at released sizes */
typedef int32_t (*init_fn)(void *cfg, size_t size);
typedef struct init_case {
    const char *name;
    init_fn init;
    size_t first, now; /* the size of the struct's first release, and today's */
} init_case;

#define WRAP(fn, T) static int32_t w_##fn(void *c, size_t n) { return fn((T *)c, n); }
WRAP(moe_context_config_init, moe_context_config)
WRAP(moe_layer_config_init, moe_layer_config)
WRAP(moe_step_config_init, moe_step_config)
WRAP(moe_comm_config_init, moe_comm_config)
WRAP(moe_layout_config_init, moe_layout_config)
WRAP(moe_parallel_config_init, moe_parallel_config)
WRAP(moe_dispatcher_config_init, moe_dispatcher_config)
WRAP(moe_plan_model_init, moe_plan_model)
WRAP(moe_plan_parallel_init, moe_plan_parallel)
WRAP(moe_checkpoint_config_init, moe_checkpoint_config)
WRAP(moe_merged_step_init, moe_merged_step)
#define INIT(fn, T, FIRST) {#fn, w_##fn, sizeof(FIRST), sizeof(T)}
static const init_case inits[] = {
    INIT(moe_context_config_init, moe_context_config, moe01_context_config),
    INIT(moe_layer_config_init, moe_layer_config, moe01_layer_config),
    INIT(moe_step_config_init, moe_step_config, moe01_step_config),
    INIT(moe_comm_config_init, moe_comm_config, moe02_comm_config),
    INIT(moe_layout_config_init, moe_layout_config, moe02_layout_config),
    INIT(moe_parallel_config_init, moe_parallel_config, moe02_parallel_config),
    INIT(moe_dispatcher_config_init, moe_dispatcher_config, moe02_dispatcher_config),
    INIT(moe_plan_model_init, moe_plan_model, moe02_plan_model),
    INIT(moe_plan_parallel_init, moe_plan_parallel, moe02_plan_parallel),
    INIT(moe_checkpoint_config_init, moe_checkpoint_config, moe02_checkpoint_config),
    INIT(moe_merged_step_init, moe_merged_step, moe02_merged_step),
};

static void init_writes_exactly(const init_case *c, size_t n)
{
    unsigned char *b = exact(n + GUARD_BYTES);
    memset(b, GUARD, n + GUARD_BYTES);
    ck_assert_msg(c->init(b, n) == MOE_OK, "%s(cfg, %zu) failed", c->name, n);
    uint32_t hdr[2];
    memcpy(hdr, b, sizeof hdr);
    ck_assert_uint_eq(hdr[0], n);
    ck_assert_uint_eq(hdr[1], MOE_API_VERSION);
    for (size_t i = 8; i < n; i++) ck_assert_msg(b[i] == 0, "%s(cfg, %zu): byte %zu not zeroed", c->name, n, i);
    guard_intact(b, n, c->name);
    free(b);
}

START_TEST(init_accepts_every_released_size)
{
    for (size_t i = 0; i < sizeof inits / sizeof inits[0]; i++) {
        const init_case *c = &inits[i];
        init_writes_exactly(c, c->first);
        init_writes_exactly(c, c->now);
        init_writes_exactly(c, c->now + 24); /* a newer host: its whole struct is zeroed */
        unsigned char buf[512];
        memset(buf, GUARD, sizeof buf);
        ck_assert_msg(c->init(buf, c->first - 8) == MOE_ERR_VERSION, "%s accepted %zu bytes", c->name, c->first - 8);
        expect_msg(NULL, MOE_ERR_VERSION, c->name, "struct_size");
        for (size_t j = 0; j < sizeof buf; j++) ck_assert_uint_eq(buf[j], GUARD); /* nothing written */
    }
}
END_TEST

/* ------------------------------------------------------------------ layer config */
static moe01_layer_config *layer01(void)
{
    moe01_layer_config *c = exact(sizeof *c);
    ck_assert_int_eq(moe_layer_config_init((moe_layer_config *)(void *)c, sizeof *c), MOE_OK);
    c->hidden_size = H, c->ffn_hidden_size = F, c->num_experts = E, c->top_k = K;
    c->capacity_factor = 1.5f;
    c->aux_loss_type = MOE_AUX_SWITCH;
    c->aux_loss_coeff = 0.01f;
    return c;
}

START_TEST(layer_config_0_1)
{
    lu_layer l = make_layer();
    moe01_layer_config *c = layer01();
    moe_layer *L = NULL;
    ck_assert_int_eq(moe_layer_create(l.ctx, (const moe_layer_config *)(void *)c, &L), MOE_OK);
    /* get_config into a 0.1 struct: its bytes only, with the defaults resolved */
    unsigned char *b = out_buf(sizeof(moe01_layer_config));
    ck_assert_int_eq(moe_layer_get_config(L, (moe_layer_config *)(void *)b), MOE_OK);
    guard_intact(b, sizeof(moe01_layer_config), "moe_layer_get_config (0.1 struct)");
    moe01_layer_config got;
    memcpy(&got, b, sizeof got);
    ck_assert_uint_eq(got.struct_size, sizeof got);
    ck_assert_uint_eq(got.api_version, MOE_API_VERSION);
    ck_assert_int_eq(got.hidden_size, H);
    ck_assert_int_eq(got.top_k, K);
    ck_assert_float_eq(got.scaling_factor, 1.0f);
    ck_assert_float_eq(got.bias_update_rate, 1e-3f);
    ck_assert_float_eq(got.capacity_factor, 1.5f);
    /* the fields 0.2 added read as their defaults */
    moe_layer_config now;
    ck_assert_int_eq(moe_layer_config_init(&now, sizeof now), MOE_OK);
    ck_assert_int_eq(moe_layer_get_config(L, &now), MOE_OK);
    ck_assert_uint_eq(now.struct_size, sizeof now);
    ck_assert_int_eq(now.graphs, MOE_GRAPHS_AUTO);
    ck_assert_int_eq(now.recompute, 0);
    ck_assert_int_eq(now.offload, 0);
    ck_assert_int_eq(now.quant_recipe, MOE_QUANT_NONE);
    ck_assert_int_eq(now.fp8_storage, 0);
    ck_assert_int_eq(memcmp((char *)&now + 4, b + 4, sizeof(moe01_layer_config) - 4), 0); /* all but struct_size */
    /* the planner reads the same 0.1 struct */
    moe_memory_stats est = {.struct_size = sizeof est};
    ck_assert_int_eq(moe_plan_layer_estimate(l.ctx, (const moe_layer_config *)(void *)c, T, &est), MOE_OK);
    ck_assert_int_gt(est.total_peak_bytes, 0);
    free(b);
    free(c);
    moe_layer_destroy(L);
    lu_destroy(&l);
}
END_TEST

START_TEST(layer_config_between_releases)
{
    lu_layer l = make_layer();
    /* 0.1 plus `graphs` and `recompute`: a prefix that ends after a whole field */
    const size_t n = offsetof(moe_layer_config, offload);
    moe_layer_config full;
    memset(&full, GUARD, sizeof full);
    ck_assert_int_eq(moe_layer_config_init(&full, n), MOE_OK);
    ck_assert_uint_eq(((unsigned char *)&full)[n], GUARD); /* init wrote n bytes only */
    full.hidden_size = H, full.ffn_hidden_size = F, full.num_experts = E, full.top_k = K;
    full.graphs = MOE_GRAPHS_OFF;
    full.recompute = MOE_LAYER_RECOMPUTE_ROUTER;
    void *c = exact(n); /* the host's struct, in exactly its bytes */
    memcpy(c, &full, n);
    moe_layer *L = NULL;
    ck_assert_int_eq(moe_layer_create(l.ctx, c, &L), MOE_OK);
    unsigned char *b = out_buf((uint32_t)n);
    ck_assert_int_eq(moe_layer_get_config(L, (moe_layer_config *)(void *)b), MOE_OK);
    guard_intact(b, n, "moe_layer_get_config (between releases)");
    moe_layer_config got;
    memset(&got, 0, sizeof got);
    memcpy(&got, b, n);
    ck_assert_uint_eq(got.struct_size, n);
    ck_assert_int_eq(got.graphs, MOE_GRAPHS_OFF);
    ck_assert_int_eq(got.recompute, MOE_LAYER_RECOMPUTE_ROUTER);
    moe_layer_destroy(L);
    free(c);

    /* ending inside a field (`recompute`, or `quant_recipe`) matches no layout */
    const size_t cuts[] = {offsetof(moe_layer_config, recompute) + 2, offsetof(moe_layer_config, quant_recipe) + 1};
    const char *names[] = {"recompute", "quant_recipe"};
    for (int i = 0; i < 2; i++) {
        moe_layer_config *d = exact(sizeof *d);
        ck_assert_int_eq(moe_layer_config_init(d, sizeof *d), MOE_OK);
        d->hidden_size = H, d->ffn_hidden_size = F, d->num_experts = E, d->top_k = K;
        d->struct_size = (uint32_t)cuts[i];
        L = (moe_layer *)d; /* sentinel: must stay */
        ck_assert_int_eq(moe_layer_create(l.ctx, d, &L), MOE_ERR_VERSION);
        ck_assert_ptr_eq(L, (moe_layer *)d);
        expect_msg(l.ctx, MOE_ERR_VERSION, "struct_size", names[i]);
        /* get_config at that size: refused, nothing written */
        unsigned char *o = out_buf((uint32_t)cuts[i]);
        ck_assert_int_eq(moe_layer_get_config(l.layer, (moe_layer_config *)(void *)o), MOE_ERR_VERSION);
        expect_msg(l.ctx, MOE_ERR_VERSION, "struct_size", names[i]);
        ck_assert_uint_eq(struct_size_of(o), cuts[i]);
        for (size_t j = 4; j < cuts[i]; j++) ck_assert_uint_eq(o[j], 0);
        guard_intact(o, cuts[i], "failed moe_layer_get_config");
        free(o);
        free(d);
    }
    free(b);
    lu_destroy(&l);
}
END_TEST

START_TEST(layer_config_larger_than_today)
{
    lu_layer l = make_layer();
    const size_t ours = sizeof(moe_layer_config), n = ours + 32;
    unsigned char *buf = exact(n);
    moe_layer_config *c = (moe_layer_config *)(void *)buf;
    ck_assert_int_eq(moe_layer_config_init(c, n), MOE_OK);
    c->hidden_size = H, c->ffn_hidden_size = F, c->num_experts = E, c->top_k = K;
    moe_layer *L = NULL;
    ck_assert_int_eq(moe_layer_create(l.ctx, c, &L), MOE_OK); /* zero tail: accepted */
    /* get_config: today's bytes, struct_size = the bytes written; the newer host's tail untouched */
    memset(buf + ours, GUARD, n - ours);
    ck_assert_int_eq(moe_layer_get_config(L, c), MOE_OK);
    ck_assert_uint_eq(c->struct_size, ours);
    ck_assert_int_eq(c->hidden_size, H);
    for (size_t i = ours; i < n; i++) ck_assert_uint_eq(buf[i], GUARD);
    moe_layer_destroy(L);
    /* a non-zero byte beyond today's struct: a feature this engine lacks */
    ck_assert_int_eq(moe_layer_config_init(c, n), MOE_OK);
    c->hidden_size = H, c->ffn_hidden_size = F, c->num_experts = E, c->top_k = K;
    buf[ours + 5] = 1;
    ck_assert_int_eq(moe_layer_create(l.ctx, c, &L), MOE_ERR_VERSION);
    char off[32];
    snprintf(off, sizeof off, "offset %zu", ours + 5);
    expect_msg(l.ctx, MOE_ERR_VERSION, off, NULL);
    free(buf);

    /* above 64 KiB: an uninitialised struct, not a layout (the engine reads none of the tail) */
    const size_t huge = (size_t)1 << 20;
    buf = calloc(1, huge);
    ck_assert_ptr_nonnull(buf);
    c = (moe_layer_config *)(void *)buf;
    ck_assert_int_eq(moe_layer_config_init(c, sizeof *c), MOE_OK);
    c->hidden_size = H, c->ffn_hidden_size = F, c->num_experts = E, c->top_k = K;
    c->struct_size = (uint32_t)huge;
    L = NULL;
    ck_assert_int_eq(moe_layer_create(l.ctx, c, &L), MOE_ERR_VERSION);
    ck_assert_ptr_null(L);
    expect_msg(l.ctx, MOE_ERR_VERSION, "struct_size", "65536");
    ck_assert_int_eq(moe_layer_config_init(c, huge), MOE_ERR_VERSION);
    free(buf);
    lu_destroy(&l);
}
END_TEST

/* ------------------------------------------------------------------ context and step configs */
START_TEST(context_and_step_config_0_1)
{
    moe01_context_config *cc = exact(sizeof *cc);
    ck_assert_int_eq(moe_context_config_init((moe_context_config *)(void *)cc, sizeof *cc), MOE_OK);
    cc->num_threads = 1;
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create((const moe_context_config *)(void *)cc, &ctx), MOE_OK);
    int32_t nt = 0;
    ck_assert_int_eq(moe_context_num_threads(ctx, &nt), MOE_OK);
    ck_assert_int_eq(nt, 1);
    moe_layer_config lc = lu_config(H, F, E, K);
    moe_layer *L = NULL;
    ck_assert_int_eq(moe_layer_create(ctx, &lc, &L), MOE_OK);
    moe01_step_config *sc = exact(sizeof *sc);
    ck_assert_int_eq(moe_step_config_init((moe_step_config *)(void *)sc, sizeof *sc), MOE_OK);
    sc->mode = MOE_STEP_EVAL;
    moe_step *s = NULL;
    ck_assert_int_eq(moe_step_create(L, (const moe_step_config *)(void *)sc, &s), MOE_OK);
    moe_step_destroy(s);
    /* 0.1 plus `flags` (a prefix of whole fields) is accepted; half of `flags` is not */
    moe_step_config sfull;
    ck_assert_int_eq(moe_step_config_init(&sfull, sizeof sfull), MOE_OK);
    sfull.struct_size = (uint32_t)offsetof(moe_step_config, reserved0);
    sfull.flags = MOE_STEP_EXPLICIT_AUX_SCALE;
    s = NULL;
    ck_assert_int_eq(moe_step_create(L, &sfull, &s), MOE_OK);
    moe_step_destroy(s);
    sfull.struct_size = (uint32_t)offsetof(moe_step_config, flags) + 2;
    s = NULL;
    ck_assert_int_eq(moe_step_create(L, &sfull, &s), MOE_ERR_VERSION);
    ck_assert_ptr_null(s);
    expect_msg(ctx, MOE_ERR_VERSION, "moe_step_config.struct_size", "flags");
    /* below the first release: refused */
    sc->struct_size = sizeof *sc - 8;
    s = NULL;
    ck_assert_int_eq(moe_step_create(L, (const moe_step_config *)(void *)sc, &s), MOE_ERR_VERSION);
    ck_assert_ptr_null(s);
    expect_msg(ctx, MOE_ERR_VERSION, "moe_step_config.struct_size", NULL);
    moe_layer_destroy(L);
    moe_context_destroy(ctx);
    cc->struct_size = sizeof *cc - 8;
    ctx = NULL;
    ck_assert_int_eq(moe_context_create((const moe_context_config *)(void *)cc, &ctx), MOE_ERR_VERSION);
    ck_assert_ptr_null(ctx);
    expect_msg(NULL, MOE_ERR_VERSION, "moe_context_config.struct_size", NULL);
    free(sc);
    free(cc);
}
END_TEST

/* ------------------------------------------------------------------ stats written by the engine */
START_TEST(routing_stats_sizes)
{
    lu_layer l = make_layer();
    moe_step *s = forward_step(&l);
    moe_routing_stats full = {.struct_size = sizeof full};
    ck_assert_int_eq(moe_step_routing_stats(s, &full), MOE_OK);
    ck_assert_uint_eq(full.struct_size, sizeof full);
    ck_assert_int_eq(full.num_tokens, T);
    ck_assert(full.aux_loss > 0);

    const uint32_t n01 = sizeof(moe01_routing_stats), n02 = sizeof(moe02_routing_stats);
    unsigned char *b = out_buf(n01);
    ck_assert_int_eq(moe_step_routing_stats(s, (moe_routing_stats *)(void *)b), MOE_OK);
    guard_intact(b, n01, "moe_step_routing_stats (0.1 struct)");
    ck_assert_uint_eq(struct_size_of(b), n01);
    ck_assert_int_eq(memcmp(b + 4, (char *)&full + 4, n01 - 4), 0);
    free(b);
    b = out_buf(n02);
    ck_assert_int_eq(moe_step_routing_stats(s, (moe_routing_stats *)(void *)b), MOE_OK);
    guard_intact(b, n02, "moe_step_routing_stats (0.2 struct)");
    ck_assert_int_eq(memcmp(b + 4, (char *)&full + 4, n02 - 4), 0);
    free(b);
    /* a newer host's larger struct: today's bytes, struct_size says how many */
    b = out_buf(n02 + 16);
    memset(b + n02, GUARD, 16);
    ck_assert_int_eq(moe_step_routing_stats(s, (moe_routing_stats *)(void *)b), MOE_OK);
    ck_assert_uint_eq(struct_size_of(b), n02);
    for (uint32_t i = n02; i < n02 + 16 + GUARD_BYTES; i++) ck_assert_uint_eq(b[i], GUARD);
    free(b);
    /* below 0.1, or ending inside a field: refused, nothing written */
    const uint32_t bad[] = {8, 12, n01 - 8, n01 + 4};
    for (int i = 0; i < 4; i++) {
        b = out_buf(bad[i]);
        ck_assert_msg(moe_step_routing_stats(s, (moe_routing_stats *)(void *)b) == MOE_ERR_VERSION,
                      "routing stats of %u bytes accepted", bad[i]);
        expect_msg(l.ctx, MOE_ERR_VERSION, "struct_size", NULL);
        ck_assert_uint_eq(struct_size_of(b), bad[i]);
        for (uint32_t j = 4; j < bad[i]; j++) ck_assert_uint_eq(b[j], 0);
        guard_intact(b, bad[i], "failed moe_step_routing_stats");
        free(b);
    }
    moe_step_destroy(s);
    lu_destroy(&l);
}
END_TEST

typedef int32_t (*mem_stats_fn)(const void *obj, moe_memory_stats *stats);
static int32_t ctx_stats(const void *o, moe_memory_stats *s) { return moe_context_memory_stats(o, s); }
static int32_t step_stats(const void *o, moe_memory_stats *s) { return moe_step_memory_stats(o, s); }

static void memory_stats_sizes(const char *what, mem_stats_fn fn, const void *obj, moe_context *ctx)
{
    moe_memory_stats full = {.struct_size = sizeof full};
    ck_assert_int_eq(fn(obj, &full), MOE_OK);
    ck_assert_uint_eq(full.struct_size, sizeof full);
    ck_assert_int_gt(full.total_peak_bytes, 0);
    const uint32_t n01 = sizeof(moe01_memory_stats), n02 = sizeof(moe02_memory_stats);
    unsigned char *b = out_buf(n01);
    ck_assert_int_eq(fn(obj, (moe_memory_stats *)(void *)b), MOE_OK);
    guard_intact(b, n01, what);
    ck_assert_uint_eq(struct_size_of(b), n01);
    moe01_memory_stats got;
    memcpy(&got, b, sizeof got);
    ck_assert_int_eq(got.total_peak_bytes, full.total_peak_bytes);
    free(b);
    b = out_buf(n02 + 8);
    memset(b + n02, GUARD, 8);
    ck_assert_int_eq(fn(obj, (moe_memory_stats *)(void *)b), MOE_OK);
    ck_assert_uint_eq(struct_size_of(b), n02);
    guard_intact(b, n02 + 8, what);
    free(b);
    const uint32_t bad[] = {8, 16, n01 - 8, n01 + 4};
    for (int i = 0; i < 4; i++) {
        b = out_buf(bad[i]);
        ck_assert_msg(fn(obj, (moe_memory_stats *)(void *)b) == MOE_ERR_VERSION, "%s: %u bytes accepted", what, bad[i]);
        expect_msg(ctx, MOE_ERR_VERSION, "struct_size", NULL);
        for (uint32_t j = 4; j < bad[i]; j++) ck_assert_uint_eq(b[j], 0);
        guard_intact(b, bad[i], what);
        free(b);
    }
}

START_TEST(memory_stats_sizes_all_writers)
{
    lu_layer l = make_layer();
    moe_step *s = forward_step(&l);
    memory_stats_sizes("moe_context_memory_stats", ctx_stats, l.ctx, l.ctx);
    memory_stats_sizes("moe_step_memory_stats", step_stats, s, l.ctx);
    /* the planner's one-layer estimate writes a moe_memory_stats too */
    const uint32_t n01 = sizeof(moe01_memory_stats);
    unsigned char *b = out_buf(n01);
    ck_assert_int_eq(moe_plan_layer_estimate(l.ctx, &l.cfg, T, (moe_memory_stats *)(void *)b), MOE_OK);
    guard_intact(b, n01, "moe_plan_layer_estimate (0.1 struct)");
    ck_assert_uint_eq(struct_size_of(b), n01);
    free(b);
    b = out_buf(sizeof(moe_memory_stats) + 8);
    memset(b + sizeof(moe_memory_stats), GUARD, 8);
    ck_assert_int_eq(moe_plan_layer_estimate(l.ctx, &l.cfg, T, (moe_memory_stats *)(void *)b), MOE_OK);
    ck_assert_uint_eq(struct_size_of(b), sizeof(moe_memory_stats));
    guard_intact(b, sizeof(moe_memory_stats) + 8, "moe_plan_layer_estimate (larger struct)");
    free(b);
    b = out_buf(n01 + 4);
    ck_assert_int_eq(moe_plan_layer_estimate(l.ctx, &l.cfg, T, (moe_memory_stats *)(void *)b), MOE_ERR_VERSION);
    expect_msg(l.ctx, MOE_ERR_VERSION, "struct_size", NULL);
    free(b);
    moe_step_destroy(s);
    lu_destroy(&l);
}
END_TEST

START_TEST(plan_structs_sizes)
{
    moe_plan_model m;
    moe_plan_parallel p;
    ck_assert_int_eq(moe_plan_model_init(&m, sizeof m), MOE_OK);
    ck_assert_int_eq(moe_plan_parallel_init(&p, sizeof p), MOE_OK);
    ck_assert_int_eq(moe_plan_model_preset("mixtral-8x7b", &m, &p), MOE_OK);
    const uint32_t n = sizeof(moe02_plan_result);
    unsigned char *b = out_buf(n);
    ck_assert_int_eq(moe_plan_estimate(&m, &p, (moe_plan_result *)(void *)b), MOE_OK);
    guard_intact(b, n, "moe_plan_estimate");
    ck_assert_uint_eq(struct_size_of(b), n);
    moe_plan_result r;
    memcpy(&r, b, sizeof r);
    ck_assert_int_gt(r.total_bytes, 0);
    free(b);
    b = out_buf(n + 16);
    memset(b + n, GUARD, 16);
    ck_assert_int_eq(moe_plan_estimate(&m, &p, (moe_plan_result *)(void *)b), MOE_OK);
    ck_assert_uint_eq(struct_size_of(b), n); /* the bytes written */
    guard_intact(b, n + 16, "moe_plan_estimate (larger struct)");
    free(b);
    b = out_buf(n - 8); /* 0.2 is this struct's first release: nothing smaller exists */
    ck_assert_int_eq(moe_plan_estimate(&m, &p, (moe_plan_result *)(void *)b), MOE_ERR_VERSION);
    expect_msg(NULL, MOE_ERR_VERSION, "struct_size", NULL);
    guard_intact(b, n - 8, "failed moe_plan_estimate");
    free(b);
    /* the inputs: 0.2 sizes (exact heap blocks), smaller refused */
    moe02_plan_model *m2 = exact(sizeof *m2);
    moe02_plan_parallel *p2 = exact(sizeof *p2);
    memcpy(m2, &m, sizeof *m2);
    memcpy(p2, &p, sizeof *p2);
    moe_plan_result r2 = {.struct_size = sizeof r2};
    ck_assert_int_eq(moe_plan_estimate((const moe_plan_model *)(void *)m2, (const moe_plan_parallel *)(void *)p2, &r2),
                     MOE_OK);
    ck_assert_int_eq(r2.total_bytes, r.total_bytes);
    m2->struct_size -= 8;
    ck_assert_int_eq(moe_plan_estimate((const moe_plan_model *)(void *)m2, (const moe_plan_parallel *)(void *)p2, &r2),
                     MOE_ERR_VERSION);
    expect_msg(NULL, MOE_ERR_VERSION, "moe_plan_model.struct_size", NULL);
    free(m2);
    free(p2);
}
END_TEST

START_TEST(nonfinite_report_sizes)
{
    lu_layer l = make_layer();
    moe_step *s = forward_step(&l);
    moe_step_destroy(s);
    const uint32_t n = sizeof(moe02_nonfinite_report);
    unsigned char *b = out_buf(n);
    ck_assert_int_eq(moe_layer_check_gradients(l.layer, (moe_nonfinite_report *)(void *)b, NULL), MOE_OK);
    guard_intact(b, n, "moe_layer_check_gradients");
    ck_assert_uint_eq(struct_size_of(b), n);
    moe_nonfinite_report r;
    memcpy(&r, b, sizeof r);
    ck_assert_int_eq(r.first_slot, -1); /* no backward: zero gradients */
    free(b);
    b = out_buf(n + 16);
    memset(b + n, GUARD, 16);
    ck_assert_int_eq(moe_layer_check_gradients(l.layer, (moe_nonfinite_report *)(void *)b, NULL), MOE_OK);
    ck_assert_uint_eq(struct_size_of(b), n); /* the bytes written */
    guard_intact(b, n + 16, "moe_layer_check_gradients (larger struct)");
    free(b);
    const uint32_t bad[] = {8, n - 8}; /* 0.2 is this struct's first release: nothing smaller exists */
    for (int i = 0; i < 2; i++) {
        b = out_buf(bad[i]);
        ck_assert_int_eq(moe_layer_check_gradients(l.layer, (moe_nonfinite_report *)(void *)b, NULL), MOE_ERR_VERSION);
        expect_msg(l.ctx, MOE_ERR_VERSION, "out->struct_size", NULL);
        for (uint32_t j = 4; j < bad[i]; j++) ck_assert_uint_eq(b[j], 0);
        guard_intact(b, bad[i], "failed moe_layer_check_gradients");
        free(b);
    }
    lu_destroy(&l);
}
END_TEST

/* ------------------------------------------------------------------ the other 0.2 configs */
START_TEST(configs_born_in_0_2)
{
    lu_layer l = make_layer();
    /* comm config: exact 0.2 block accepted; smaller refused */
    moe02_comm_config *cc = exact(sizeof *cc);
    ck_assert_int_eq(moe_comm_config_init((moe_comm_config *)(void *)cc, sizeof *cc), MOE_OK);
    moe_comm *comm = NULL;
    ck_assert_int_eq(moe_comm_create_self(l.ctx, (const moe_comm_config *)(void *)cc, &comm), MOE_OK);
    cc->struct_size = sizeof *cc - 8;
    moe_comm *c2 = NULL;
    ck_assert_int_eq(moe_comm_create_self(l.ctx, (const moe_comm_config *)(void *)cc, &c2), MOE_ERR_VERSION);
    ck_assert_ptr_null(c2);
    expect_msg(l.ctx, MOE_ERR_VERSION, "moe_comm_config.struct_size", NULL);
    free(cc);
    /* layout config */
    moe02_layout_config *lc = exact(sizeof *lc);
    ck_assert_int_eq(moe_layout_config_init((moe_layout_config *)(void *)lc, sizeof *lc), MOE_OK);
    lc->world_size = 4, lc->ep = 2;
    moe_layout *lay = NULL;
    ck_assert_int_eq(moe_layout_create((const moe_layout_config *)(void *)lc, &lay), MOE_OK);
    moe_layout_destroy(lay);
    lc->struct_size = sizeof *lc - 8;
    ck_assert_int_eq(moe_layout_create((const moe_layout_config *)(void *)lc, &lay), MOE_ERR_VERSION);
    free(lc);
    /* parallel config */
    moe02_parallel_config *pc = exact(sizeof *pc);
    ck_assert_int_eq(moe_parallel_config_init((moe_parallel_config *)(void *)pc, sizeof *pc), MOE_OK);
    pc->ep_comm = comm;
    moe_layer *L = NULL;
    ck_assert_int_eq(moe_layer_create_parallel(l.ctx, &l.cfg, (const moe_parallel_config *)(void *)pc, &L), MOE_OK);
    moe_layer_destroy(L);
    pc->struct_size = sizeof *pc - 8;
    L = NULL;
    ck_assert_int_eq(moe_layer_create_parallel(l.ctx, &l.cfg, (const moe_parallel_config *)(void *)pc, &L),
                     MOE_ERR_VERSION);
    ck_assert_ptr_null(L);
    free(pc);
    /* dispatcher config */
    moe02_dispatcher_config *dc = exact(sizeof *dc);
    ck_assert_int_eq(moe_dispatcher_config_init((moe_dispatcher_config *)(void *)dc, sizeof *dc), MOE_OK);
    dc->hidden = H, dc->num_experts = E, dc->top_k = K;
    moe_dispatcher *d = NULL;
    ck_assert_int_eq(moe_dispatcher_create(l.ctx, (const moe_dispatcher_config *)(void *)dc, comm, &d), MOE_OK);
    moe_dispatcher_destroy(d);
    dc->struct_size = sizeof *dc - 8;
    d = NULL;
    ck_assert_int_eq(moe_dispatcher_create(l.ctx, (const moe_dispatcher_config *)(void *)dc, comm, &d), MOE_ERR_VERSION);
    ck_assert_ptr_null(d);
    expect_msg(l.ctx, MOE_ERR_VERSION, "moe_dispatcher_config.struct_size", NULL);
    free(dc);
    moe_comm_destroy(comm);
    lu_destroy(&l);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("abi_sizes");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, frozen_layouts_are_prefixes_of_today);
    tcase_add_test(tc, init_accepts_every_released_size);
    tcase_add_test(tc, layer_config_0_1);
    tcase_add_test(tc, layer_config_between_releases);
    tcase_add_test(tc, layer_config_larger_than_today);
    tcase_add_test(tc, context_and_step_config_0_1);
    tcase_add_test(tc, routing_stats_sizes);
    tcase_add_test(tc, memory_stats_sizes_all_writers);
    tcase_add_test(tc, plan_structs_sizes);
    tcase_add_test(tc, nonfinite_report_sizes);
    tcase_add_test(tc, configs_born_in_0_2);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}

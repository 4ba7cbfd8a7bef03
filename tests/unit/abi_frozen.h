/*
 * Frozen copies of the ABI structs that carry struct_size, as released hosts compiled them.
 *
 *  - moe01_*: the 0.1 header (commit d337cf0 "Skeleton: public ABI v0.1 header", unchanged until the
 *    0.2.0 version bump e190197): context config, layer config (up to `seed`), step config, memory
 *    stats (up to `num_allocations`), routing stats (up to `z_loss`) and the three hook tables.
 *  - moe02_*: the final 0.2 layout of every struct with struct_size (0.2 added the communicator,
 *    layout, parallel, dispatcher and planner structs and the non-finite gradient report; it appended fields to the layer config, the
 *    step config and both stats structs).
 *
 * These copies never change: a host built against 0.1 or 0.2 keeps these bytes forever. The tests
 * (test_abi_sizes.c) check that today's abi/moe.h keeps every frozen field at the same offset with
 * the same size, and that the engine accepts and fills structs of these sizes. Pointers to hook
 * tables and handles are `const void *` / `void *` here (same size and alignment).
 */
#ifndef MOE_TEST_ABI_FROZEN_H
#define MOE_TEST_ABI_FROZEN_H

#include <stdint.h>

/* ================================================================ 0.1 */
typedef struct moe01_allocator {
    uint32_t struct_size;
    uint32_t reserved;
    void *user_data;
    void *alloc;
    void *free;
    void *release;
} moe01_allocator;

typedef struct moe01_logger {
    uint32_t struct_size;
    int32_t max_level;
    void *user_data;
    void *log;
    void *release;
} moe01_logger;

typedef struct moe01_profiler {
    uint32_t struct_size;
    uint32_t reserved;
    void *user_data;
    void *range_push;
    void *range_pop;
    void *release;
} moe01_profiler;

typedef struct moe01_context_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t device_type;
    int32_t device_id;
    int32_t num_threads;
    int32_t reserved0;
    const void *allocator;
    const void *logger;
    const void *profiler;
} moe01_context_config;

typedef struct moe01_memory_stats {
    uint32_t struct_size;
    uint32_t reserved;
    int64_t current_bytes[8];
    int64_t peak_bytes[8];
    int64_t total_current_bytes;
    int64_t total_peak_bytes;
    int64_t num_allocations;
} moe01_memory_stats;

typedef struct moe01_layer_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int64_t hidden_size;
    int64_t ffn_hidden_size;
    int32_t num_experts;
    int32_t top_k;
    int32_t activation;
    int32_t score_function;
    int32_t num_groups;
    int32_t group_topk;
    float scaling_factor;
    int32_t expert_bias;
    float bias_update_rate;
    int32_t aux_loss_type;
    float aux_loss_coeff;
    int64_t seq_length;
    float z_loss_coeff;
    float capacity_factor;
    int32_t drop_policy;
    int32_t pad_to_capacity;
    int64_t shared_ffn_hidden_size;
    int32_t shared_gate;
    int32_t param_dtype;
    int32_t nonfinite_policy;
    int32_t reserved0;
    uint64_t seed;
} moe01_layer_config;

typedef struct moe01_step_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t mode;
    float aux_loss_scale;
} moe01_step_config;

typedef struct moe01_routing_stats {
    uint32_t struct_size;
    uint32_t reserved;
    int64_t num_tokens;
    int64_t num_assignments;
    int64_t dropped;
    int64_t padded_rows;
    int64_t capacity;
    double aux_loss;
    double z_loss;
} moe01_routing_stats;

/* ================================================================ 0.2 */
typedef moe01_allocator moe02_allocator;
typedef moe01_logger moe02_logger;
typedef moe01_profiler moe02_profiler;
typedef moe01_context_config moe02_context_config;

typedef struct moe02_memory_stats {
    uint32_t struct_size;
    uint32_t reserved;
    int64_t current_bytes[8];
    int64_t peak_bytes[8];
    int64_t total_current_bytes;
    int64_t total_peak_bytes;
    int64_t num_allocations;
    int64_t cached_bytes;
    int64_t reserved_bytes;
    int64_t peak_reserved_bytes;
    int64_t device_allocations;
    int64_t trims;
} moe02_memory_stats;

typedef struct moe02_layer_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int64_t hidden_size;
    int64_t ffn_hidden_size;
    int32_t num_experts;
    int32_t top_k;
    int32_t activation;
    int32_t score_function;
    int32_t num_groups;
    int32_t group_topk;
    float scaling_factor;
    int32_t expert_bias;
    float bias_update_rate;
    int32_t aux_loss_type;
    float aux_loss_coeff;
    int64_t seq_length;
    float z_loss_coeff;
    float capacity_factor;
    int32_t drop_policy;
    int32_t pad_to_capacity;
    int64_t shared_ffn_hidden_size;
    int32_t shared_gate;
    int32_t param_dtype;
    int32_t nonfinite_policy;
    int32_t reserved0;
    uint64_t seed;
    int32_t graphs;
    int32_t recompute;
    int32_t offload;
    int32_t quant_recipe;
    int32_t fp8_storage;
    int32_t reserved3;
} moe02_layer_config;

typedef struct moe02_step_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t mode;
    float aux_loss_scale;
    int32_t flags;
    int32_t reserved0;
} moe02_step_config;

typedef struct moe02_routing_stats {
    uint32_t struct_size;
    uint32_t reserved;
    int64_t num_tokens;
    int64_t num_assignments;
    int64_t dropped;
    int64_t padded_rows;
    int64_t capacity;
    double aux_loss;
    double z_loss;
    int64_t quant_saturated;
} moe02_routing_stats;

typedef struct moe02_comm_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t timeout_ms;
    int32_t reserved0;
} moe02_comm_config;

typedef struct moe02_comm_hooks {
    uint32_t struct_size;
    int32_t rank;
    int32_t size;
    int32_t reserved0;
    void *user_data;
    void *all_to_all_v;
    void *all_gather_v;
    void *all_reduce;
    void *broadcast;
    void *barrier;
    void *release;
} moe02_comm_hooks;

typedef struct moe02_layout_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t world_size;
    int32_t tp, cp, dp, pp;
    int32_t etp, ep;
    const char *order;
} moe02_layout_config;

typedef struct moe02_parallel_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    void *ep_comm;
    void *etp_comm;
    void *aux_comm;
    void *edp_comm;
    void *dp_comm;
    void *bias_comm;
    int32_t dispatcher;
    int32_t num_chunks;
} moe02_parallel_config;

typedef struct moe02_dispatcher_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t kind;
    int32_t dtype;
    int64_t hidden;
    int32_t num_experts;
    int32_t top_k;
    double capacity_factor;
    int32_t drop_policy;
    int32_t pad_to_capacity;
    int32_t combine;
    int32_t reserved0;
} moe02_dispatcher_config;

typedef struct moe02_plan_model {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t num_layers;
    int32_t first_dense_layers;
    int32_t moe_layer_freq;
    int32_t num_experts;
    int32_t top_k;
    int32_t num_shared_experts;
    int64_t hidden_size;
    int64_t ffn_hidden_size;
    int64_t moe_ffn_hidden_size;
    int64_t shared_ffn_hidden_size;
    int64_t vocab_size;
    int32_t activation;
    int32_t tied_embeddings;
    int32_t attention;
    int32_t num_heads;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t q_lora_rank;
    int32_t kv_lora_rank;
    int32_t qk_rope_head_dim;
    int32_t v_head_dim;
} moe02_plan_model;

typedef struct moe02_plan_parallel {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t tp, cp, dp, pp;
    int32_t vpp;
    int32_t ep, etp;
    int32_t micro_batch;
    int64_t seq_length;
    int32_t num_micro_batches;
    int32_t param_bytes;
    int32_t grad_bytes;
    int32_t optimizer_bytes;
    int32_t activation_bytes;
    int32_t distributed_optimizer;
    int32_t recompute;
    int32_t offload;
    int64_t device_memory_bytes;
} moe02_plan_parallel;

typedef struct moe02_plan_result {
    uint32_t struct_size;
    int32_t stage;
    int64_t bytes[8];
    int64_t total_bytes;
    int64_t device_memory_bytes;
    int32_t fits;
    int32_t reserved;
    int64_t comm_bytes[8];
    int64_t params_total;
    int64_t params_per_gpu;
} moe02_plan_result;

typedef struct moe02_nonfinite_report {
    uint32_t struct_size;
    int32_t first_slot;
    int64_t num_nonfinite;
    int64_t num_nan;
    int32_t num_experts;
    int32_t num_slots;
    int32_t first_expert;
    int32_t first_kind;
    int64_t first_index;
} moe02_nonfinite_report;

typedef struct moe02_state_entry {
    uint32_t struct_size;
    int32_t kind;
    int32_t slot;
    int32_t dtype;
    int32_t ndim;
    int32_t view_ndim;
    int64_t shape[4];
    int64_t view_shape[4];
    int64_t offset[4];
    int64_t length[4];
    char name[96];
} moe02_state_entry;

typedef struct moe02_checkpoint_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    const char *dir;
    const char *name;
    void *comm;
    int32_t flags;
    int32_t reserved0;
} moe02_checkpoint_config;

typedef struct moe02_merged_step {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    void *forward_step;
    const void *x;
    void *y;
    void *backward_step;
    const void *dy;
    void *dx;
    void *weights_step;
    int32_t flags;
    int32_t reserved0;
} moe02_merged_step;

#endif /* MOE_TEST_ABI_FROZEN_H */

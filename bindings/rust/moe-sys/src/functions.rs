//! Every `MOE_API` function of abi/moe.h, in the header's order. Fallible calls return an
//! `i32` status (`MOE_OK` = 0); the message is read with `moe_context_last_error`.
use std::ffi::{c_char, c_void};

use crate::dlpack::{DLManagedTensor, DLTensor};
use crate::hooks::moe_comm_hooks;
use crate::structs::*;

extern "C" {
    // ---- version and status
    pub fn moe_version_number() -> u32;
    pub fn moe_version_string() -> *const c_char;
    pub fn moe_build_features() -> u64;
    pub fn moe_status_name(status: i32) -> *const c_char;
    pub fn moe_status_string(status: i32) -> *const c_char;
    pub fn moe_context_last_error(ctx: *const moe_context, buf: *mut c_char, cap: usize) -> usize;
    pub fn moe_last_error(buf: *mut c_char, cap: usize) -> usize;

    // ---- context
    pub fn moe_context_config_init(cfg: *mut moe_context_config, struct_size: usize) -> i32;
    pub fn moe_context_create(cfg: *const moe_context_config, out: *mut *mut moe_context) -> i32;
    pub fn moe_context_destroy(ctx: *mut moe_context);
    pub fn moe_context_num_threads(ctx: *const moe_context, out: *mut i32) -> i32;
    pub fn moe_memory_stats_init(stats: *mut moe_memory_stats, struct_size: usize) -> i32;
    pub fn moe_context_memory_stats(ctx: *const moe_context, stats: *mut moe_memory_stats) -> i32;
    pub fn moe_context_memory_trim(ctx: *mut moe_context, stream: *mut c_void) -> i32;

    // ---- layer
    pub fn moe_layer_config_init(cfg: *mut moe_layer_config, struct_size: usize) -> i32;
    pub fn moe_layer_create(ctx: *mut moe_context, cfg: *const moe_layer_config, out: *mut *mut moe_layer) -> i32;
    pub fn moe_layer_destroy(layer: *mut moe_layer);
    pub fn moe_layer_get_config(layer: *const moe_layer, out: *mut moe_layer_config) -> i32;

    // ---- parameters
    pub fn moe_layer_has_param(layer: *const moe_layer, slot: i32) -> i32;
    pub fn moe_layer_param(layer: *mut moe_layer, slot: i32, out: *mut *mut DLManagedTensor) -> i32;
    pub fn moe_layer_grad(layer: *mut moe_layer, slot: i32, out: *mut *mut DLManagedTensor) -> i32;
    pub fn moe_layer_import_param(layer: *mut moe_layer, slot: i32, src: *const DLTensor) -> i32;
    pub fn moe_layer_export_param(layer: *mut moe_layer, slot: i32, grad: i32, dst: *mut DLTensor) -> i32;
    pub fn moe_layer_init_params(layer: *mut moe_layer, seed: u64) -> i32;
    pub fn moe_layer_zero_grad(layer: *mut moe_layer) -> i32;
    pub fn moe_layer_set_grad_mode(layer: *mut moe_layer, mode: i32) -> i32;

    // ---- non-finite gradients (0.2)
    pub fn moe_nonfinite_report_init(out: *mut moe_nonfinite_report, struct_size: usize) -> i32;
    pub fn moe_layer_check_gradients(
        layer: *const moe_layer,
        out: *mut moe_nonfinite_report,
        stream: *mut c_void,
    ) -> i32;

    // ---- steps
    pub fn moe_step_config_init(cfg: *mut moe_step_config, struct_size: usize) -> i32;
    pub fn moe_step_create(layer: *mut moe_layer, cfg: *const moe_step_config, out: *mut *mut moe_step) -> i32;
    pub fn moe_step_destroy(step: *mut moe_step);
    pub fn moe_layer_forward(
        layer: *mut moe_layer,
        step: *mut moe_step,
        x: *const DLTensor,
        y: *mut DLTensor,
        stream: *mut c_void,
    ) -> i32;
    pub fn moe_layer_backward(
        layer: *mut moe_layer,
        step: *mut moe_step,
        dy: *const DLTensor,
        dx: *mut DLTensor,
        stream: *mut c_void,
    ) -> i32;
    pub fn moe_layer_backward_data(
        layer: *mut moe_layer,
        step: *mut moe_step,
        dy: *const DLTensor,
        dx: *mut DLTensor,
        stream: *mut c_void,
    ) -> i32;
    pub fn moe_layer_backward_weights(layer: *mut moe_layer, step: *mut moe_step, stream: *mut c_void) -> i32;
    pub fn moe_step_prefetch(step: *mut moe_step, stream: *mut c_void) -> i32;

    // ---- merged forward/backward (0.2)
    pub fn moe_merged_step_init(args: *mut moe_merged_step, struct_size: usize) -> i32;
    pub fn moe_layer_forward_backward(layer: *mut moe_layer, args: *const moe_merged_step, stream: *mut c_void) -> i32;

    // ---- routing statistics
    pub fn moe_routing_stats_init(stats: *mut moe_routing_stats, struct_size: usize) -> i32;
    pub fn moe_step_routing_stats(step: *const moe_step, stats: *mut moe_routing_stats) -> i32;
    pub fn moe_step_memory_stats(step: *const moe_step, stats: *mut moe_memory_stats) -> i32;
    pub fn moe_step_export_routing(step: *const moe_step, what: i32, out: *mut *mut DLManagedTensor) -> i32;

    // ---- expert bias
    pub fn moe_layer_expert_counts(layer: *const moe_layer, out: *mut DLTensor) -> i32;
    pub fn moe_layer_update_expert_bias(layer: *mut moe_layer, counts: *const DLTensor) -> i32;
    pub fn moe_layer_reset_global_aux(layer: *mut moe_layer) -> i32;

    // ---- checkpoints (0.2)
    pub fn moe_state_entry_init(out: *mut moe_state_entry, struct_size: usize) -> i32;
    pub fn moe_layer_state_count(layer: *const moe_layer, flags: i32, count: *mut i32) -> i32;
    pub fn moe_layer_state_entry(layer: *const moe_layer, flags: i32, index: i32, out: *mut moe_state_entry) -> i32;
    pub fn moe_layer_attach_state(layer: *mut moe_layer, slot: i32, name: *const c_char, tensor: *const DLTensor) -> i32;
    pub fn moe_layer_detach_state(layer: *mut moe_layer, slot: i32, name: *const c_char) -> i32;
    pub fn moe_checkpoint_config_init(cfg: *mut moe_checkpoint_config, struct_size: usize) -> i32;
    pub fn moe_layer_save(layer: *mut moe_layer, cfg: *const moe_checkpoint_config) -> i32;
    pub fn moe_layer_load(layer: *mut moe_layer, cfg: *const moe_checkpoint_config) -> i32;

    // ---- communicators
    pub fn moe_comm_config_init(cfg: *mut moe_comm_config, struct_size: usize) -> i32;
    pub fn moe_comm_create_self(ctx: *mut moe_context, cfg: *const moe_comm_config, out: *mut *mut moe_comm) -> i32;
    pub fn moe_comm_create_mpi(
        ctx: *mut moe_context,
        cfg: *const moe_comm_config,
        mpi_comm: *const c_void,
        out: *mut *mut moe_comm,
    ) -> i32;
    pub fn moe_comm_nccl_unique_id(buf: *mut c_void, cap: usize, len: *mut usize) -> i32;
    pub fn moe_comm_create_nccl(
        ctx: *mut moe_context,
        cfg: *const moe_comm_config,
        unique_id: *const c_void,
        id_len: usize,
        rank: i32,
        size: i32,
        out: *mut *mut moe_comm,
    ) -> i32;
    pub fn moe_comm_create_hooks(
        ctx: *mut moe_context,
        cfg: *const moe_comm_config,
        hooks: *const moe_comm_hooks,
        out: *mut *mut moe_comm,
    ) -> i32;
    pub fn moe_comm_create_modeled(
        inner: *mut moe_comm,
        latency_us: f64,
        bandwidth_gb_per_s: f64,
        out: *mut *mut moe_comm,
    ) -> i32;
    pub fn moe_comm_split(comm: *mut moe_comm, color: i32, key: i32, out: *mut *mut moe_comm) -> i32;
    pub fn moe_comm_rank(comm: *const moe_comm, out: *mut i32) -> i32;
    pub fn moe_comm_size(comm: *const moe_comm, out: *mut i32) -> i32;
    pub fn moe_comm_kind(comm: *const moe_comm, out: *mut i32) -> i32;
    pub fn moe_comm_destroy(comm: *mut moe_comm);

    // ---- Parallel Folding layouts
    pub fn moe_layout_config_init(cfg: *mut moe_layout_config, struct_size: usize) -> i32;
    pub fn moe_layout_create(cfg: *const moe_layout_config, out: *mut *mut moe_layout) -> i32;
    pub fn moe_layout_destroy(layout: *mut moe_layout);
    pub fn moe_layout_sizes(
        layout: *const moe_layout,
        tp: *mut i32,
        cp: *mut i32,
        dp: *mut i32,
        pp: *mut i32,
        etp: *mut i32,
        ep: *mut i32,
        edp: *mut i32,
    ) -> i32;
    pub fn moe_layout_group(
        layout: *const moe_layout,
        rank: i32,
        group: i32,
        members: *mut i32,
        cap: i32,
        count: *mut i32,
        index: *mut i32,
    ) -> i32;
    pub fn moe_comm_split_layout(
        world: *mut moe_comm,
        layout: *const moe_layout,
        group: i32,
        out: *mut *mut moe_comm,
    ) -> i32;

    // ---- expert parallelism
    pub fn moe_parallel_config_init(cfg: *mut moe_parallel_config, struct_size: usize) -> i32;
    pub fn moe_layer_create_parallel(
        ctx: *mut moe_context,
        cfg: *const moe_layer_config,
        par: *const moe_parallel_config,
        out: *mut *mut moe_layer,
    ) -> i32;
    pub fn moe_layer_reduce_grads(layer: *mut moe_layer, stream: *mut c_void) -> i32;

    // ---- standalone token dispatcher
    pub fn moe_dispatcher_config_init(cfg: *mut moe_dispatcher_config, struct_size: usize) -> i32;
    pub fn moe_dispatcher_create(
        ctx: *mut moe_context,
        cfg: *const moe_dispatcher_config,
        ep_comm: *mut moe_comm,
        out: *mut *mut moe_dispatcher,
    ) -> i32;
    pub fn moe_dispatcher_local_experts(
        d: *const moe_dispatcher,
        num_local_experts: *mut i32,
        first_expert: *mut i32,
    ) -> i32;
    pub fn moe_dispatcher_destroy(d: *mut moe_dispatcher);
    pub fn moe_dispatcher_dispatch(
        d: *mut moe_dispatcher,
        x: *const DLTensor,
        indices: *const DLTensor,
        probs: *const DLTensor,
        out: *mut *mut moe_dispatch,
        stream: *mut c_void,
    ) -> i32;
    pub fn moe_dispatch_info(h: *const moe_dispatch, num_rows: *mut i64, dropped: *mut i64, padded: *mut i64) -> i32;
    pub fn moe_dispatch_rows(
        h: *const moe_dispatch,
        x_rows: *mut DLTensor,
        row_probs: *mut DLTensor,
        tokens_per_expert: *mut DLTensor,
    ) -> i32;
    pub fn moe_dispatch_combine(h: *mut moe_dispatch, y_rows: *const DLTensor, y: *mut DLTensor, stream: *mut c_void) -> i32;
    pub fn moe_dispatch_combine_backward(
        h: *mut moe_dispatch,
        dy: *const DLTensor,
        dy_rows: *mut DLTensor,
        d_row_probs: *mut DLTensor,
        stream: *mut c_void,
    ) -> i32;
    pub fn moe_dispatch_backward(
        h: *mut moe_dispatch,
        dx_rows: *const DLTensor,
        d_row_probs: *const DLTensor,
        dx: *mut DLTensor,
        dprobs: *mut DLTensor,
        stream: *mut c_void,
    ) -> i32;
    pub fn moe_dispatch_destroy(h: *mut moe_dispatch);

    // ---- memory planner
    pub fn moe_plan_model_init(model: *mut moe_plan_model, struct_size: usize) -> i32;
    pub fn moe_plan_parallel_init(par: *mut moe_plan_parallel, struct_size: usize) -> i32;
    pub fn moe_plan_model_preset(name: *const c_char, model: *mut moe_plan_model, par: *mut moe_plan_parallel) -> i32;
    pub fn moe_plan_result_init(out: *mut moe_plan_result, struct_size: usize) -> i32;
    pub fn moe_plan_estimate(
        model: *const moe_plan_model,
        par: *const moe_plan_parallel,
        out: *mut moe_plan_result,
    ) -> i32;
    pub fn moe_plan_layer_estimate(
        ctx: *mut moe_context,
        cfg: *const moe_layer_config,
        tokens: i64,
        out: *mut moe_memory_stats,
    ) -> i32;

    // ---- introspection
    pub fn moe_struct_size(kind: i32, size: *mut usize, min_size: *mut usize) -> i32;
    pub fn moe_enum_name(family: i32, value: i64) -> *const c_char;
    pub fn moe_enum_value(family: i32, name: *const c_char, value: *mut i64) -> i32;
}

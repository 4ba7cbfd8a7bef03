//! Opaque handles and the config / statistics structs. Config structs begin with
//! {struct_size, api_version, next}: fill them with the matching `*_init` first.
use std::ffi::{c_char, c_void};

use crate::constants::{MOE_MEM_NUM_CATEGORIES, MOE_PLAN_COMM_NUM, MOE_PLAN_NUM_CATEGORIES};
use crate::dlpack::DLTensor;
use crate::hooks::{moe_allocator, moe_logger, moe_profiler};

macro_rules! opaque {
    ($($name:ident),*) => {$(
        /// Opaque handle; only ever used behind a pointer.
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
            // not Send, Sync or Unpin: the C object is only reached through raw pointers
            _marker: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
        }
    )*};
}
opaque!(moe_context, moe_layer, moe_step, moe_comm, moe_layout, moe_dispatcher, moe_dispatch);

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_context_config {
    pub struct_size: u32,
    pub api_version: u32,
    pub next: *const c_void,
    pub device_type: i32,
    pub device_id: i32,
    pub num_threads: i32,
    pub reserved0: i32,
    pub allocator: *const moe_allocator,
    pub logger: *const moe_logger,
    pub profiler: *const moe_profiler,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct moe_memory_stats {
    pub struct_size: u32,
    pub reserved: u32,
    pub current_bytes: [i64; MOE_MEM_NUM_CATEGORIES],
    pub peak_bytes: [i64; MOE_MEM_NUM_CATEGORIES],
    pub total_current_bytes: i64,
    pub total_peak_bytes: i64,
    pub num_allocations: i64,
    // since 0.2 (struct_size covers them): the built-in caching pool
    pub cached_bytes: i64,
    pub reserved_bytes: i64,
    pub peak_reserved_bytes: i64,
    pub device_allocations: i64,
    pub trims: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_layer_config {
    pub struct_size: u32,
    pub api_version: u32,
    pub next: *const c_void,
    pub hidden_size: i64,
    pub ffn_hidden_size: i64,
    pub num_experts: i32,
    pub top_k: i32,
    pub activation: i32,
    pub score_function: i32,
    pub num_groups: i32,
    pub group_topk: i32,
    pub scaling_factor: f32,
    pub expert_bias: i32,
    pub bias_update_rate: f32,
    pub aux_loss_type: i32,
    pub aux_loss_coeff: f32,
    pub seq_length: i64,
    pub z_loss_coeff: f32,
    pub capacity_factor: f32,
    pub drop_policy: i32,
    pub pad_to_capacity: i32,
    pub shared_ffn_hidden_size: i64,
    pub shared_gate: i32,
    pub param_dtype: i32,
    pub nonfinite_policy: i32,
    pub reserved0: i32,
    pub seed: u64,
    /// MOE_GRAPHS_* (since 0.2, struct_size covers it)
    pub graphs: i32,
    pub recompute: i32,
    pub offload: i32,
    /// MOE_QUANT_* recipe of the expert GEMMs (since 0.2)
    pub quant_recipe: i32,
    /// MOE_LAYER_FP8_STORE_* bits (since 0.2)
    pub fp8_storage: i32,
    pub reserved3: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_step_config {
    pub struct_size: u32,
    pub api_version: u32,
    pub next: *const c_void,
    pub mode: i32,
    /// 0 = 1.0 unless `flags` has `MOE_STEP_EXPLICIT_AUX_SCALE`
    pub aux_loss_scale: f32,
    /// MOE_STEP_EXPLICIT_AUX_SCALE bits (since 0.2, struct_size covers it)
    pub flags: i32,
    pub reserved0: i32,
}

/// The parts of one `moe_layer_forward_backward` call (merged forward/backward, 0.2): the forward of
/// micro-batch i+1, the backward of micro-batch i and deferred weight gradients; a NULL step leaves
/// its part out.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_merged_step {
    pub struct_size: u32,
    pub api_version: u32,
    pub next: *const c_void,
    pub forward_step: *mut moe_step,
    pub x: *const DLTensor,
    pub y: *mut DLTensor,
    pub backward_step: *mut moe_step,
    pub dy: *const DLTensor,
    pub dx: *mut DLTensor,
    /// a step whose weight gradients were deferred (NULL: none)
    pub weights_step: *mut moe_step,
    /// MOE_MERGED_* bits
    pub flags: i32,
    pub reserved0: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct moe_routing_stats {
    pub struct_size: u32,
    pub reserved: u32,
    pub num_tokens: i64,
    pub num_assignments: i64,
    pub dropped: i64,
    pub padded_rows: i64,
    pub capacity: i64,
    pub aux_loss: f64,
    pub z_loss: f64,
    /// saturated values of quantised operands and FP8-stored activations (since 0.2)
    pub quant_saturated: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_comm_config {
    pub struct_size: u32,
    pub api_version: u32,
    pub next: *const c_void,
    pub timeout_ms: i32,
    pub reserved0: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_layout_config {
    pub struct_size: u32,
    pub api_version: u32,
    pub next: *const c_void,
    pub world_size: i32,
    pub tp: i32,
    pub cp: i32,
    pub dp: i32,
    pub pp: i32,
    pub etp: i32,
    pub ep: i32,
    pub order: *const c_char,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_parallel_config {
    pub struct_size: u32,
    pub api_version: u32,
    pub next: *const c_void,
    pub ep_comm: *mut moe_comm,
    pub etp_comm: *mut moe_comm,
    pub aux_comm: *mut moe_comm,
    pub edp_comm: *mut moe_comm,
    pub dp_comm: *mut moe_comm,
    pub bias_comm: *mut moe_comm,
    pub dispatcher: i32,
    pub num_chunks: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_dispatcher_config {
    pub struct_size: u32,
    pub api_version: u32,
    pub next: *const c_void,
    pub kind: i32,
    pub dtype: i32,
    pub hidden: i64,
    pub num_experts: i32,
    pub top_k: i32,
    pub capacity_factor: f64,
    pub drop_policy: i32,
    pub pad_to_capacity: i32,
    pub combine: i32,
    pub reserved0: i32,
}

// ---- memory planner (0.2)
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_plan_model {
    pub struct_size: u32,
    pub api_version: u32,
    pub next: *const c_void,
    pub num_layers: i32,
    pub first_dense_layers: i32,
    pub moe_layer_freq: i32,
    pub num_experts: i32,
    pub top_k: i32,
    pub num_shared_experts: i32,
    pub hidden_size: i64,
    pub ffn_hidden_size: i64,
    pub moe_ffn_hidden_size: i64,
    pub shared_ffn_hidden_size: i64,
    pub vocab_size: i64,
    pub activation: i32,
    pub tied_embeddings: i32,
    pub attention: i32,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
    pub q_lora_rank: i32,
    pub kv_lora_rank: i32,
    pub qk_rope_head_dim: i32,
    pub v_head_dim: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_plan_parallel {
    pub struct_size: u32,
    pub api_version: u32,
    pub next: *const c_void,
    pub tp: i32,
    pub cp: i32,
    pub dp: i32,
    pub pp: i32,
    pub vpp: i32,
    pub ep: i32,
    pub etp: i32,
    pub micro_batch: i32,
    pub seq_length: i64,
    pub num_micro_batches: i32,
    pub param_bytes: i32,
    pub grad_bytes: i32,
    pub optimizer_bytes: i32,
    pub activation_bytes: i32,
    pub distributed_optimizer: i32,
    pub recompute: i32,
    pub offload: i32,
    pub device_memory_bytes: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct moe_plan_result {
    pub struct_size: u32,
    pub stage: i32,
    pub bytes: [i64; MOE_PLAN_NUM_CATEGORIES],
    pub total_bytes: i64,
    pub device_memory_bytes: i64,
    pub fits: i32,
    pub reserved: i32,
    pub comm_bytes: [i64; MOE_PLAN_COMM_NUM],
    pub params_total: i64,
    pub params_per_gpu: i64,
}

/// What `moe_layer_check_gradients` found (since 0.2). "First" is in scan order: slots, then
/// experts, then elements.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct moe_nonfinite_report {
    pub struct_size: u32,
    /// MOE_PARAM_* of the first non-finite gradient value; -1 when none
    pub first_slot: i32,
    pub num_nonfinite: i64,
    pub num_nan: i64,
    pub num_experts: i32,
    pub num_slots: i32,
    /// global expert id; -1 for the router / shared slots, and when none
    pub first_expert: i32,
    /// MOE_NONFINITE_KIND_*
    pub first_kind: i32,
    /// flat index within the expert's block of the slot (the whole slot for expert -1); -1 when none
    pub first_index: i64,
}

/// One entry of a layer's state dictionary (checkpoints, 0.2): the rank's box of a global tensor,
/// cut in `view_shape` (the global shape, except the gated EXPERT_FC1 viewed as [E, 2, F, H]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_state_entry {
    pub struct_size: u32,
    /// MOE_STATE_*
    pub kind: i32,
    /// MOE_PARAM_* it is or follows; -1 for accumulators
    pub slot: i32,
    /// MOE_DTYPE_*
    pub dtype: i32,
    pub ndim: i32,
    pub view_ndim: i32,
    pub shape: [i64; 4],
    pub view_shape: [i64; 4],
    pub offset: [i64; 4],
    pub length: [i64; 4],
    /// NUL-terminated stable name ("experts.fc1.weight")
    pub name: [c_char; 96],
}

impl Default for moe_state_entry {
    fn default() -> Self {
        moe_state_entry {
            struct_size: 0,
            kind: 0,
            slot: 0,
            dtype: 0,
            ndim: 0,
            view_ndim: 0,
            shape: [0; 4],
            view_shape: [0; 4],
            offset: [0; 4],
            length: [0; 4],
            name: [0; 96],
        }
    }
}

/// Where and how `moe_layer_save` / `moe_layer_load` work (checkpoints, 0.2).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_checkpoint_config {
    pub struct_size: u32,
    pub api_version: u32,
    pub next: *const c_void,
    pub dir: *const c_char,
    /// file stem; NULL = "moe"
    pub name: *const c_char,
    /// every saving / loading rank; NULL = this rank alone
    pub comm: *mut moe_comm,
    /// MOE_CHECKPOINT_*
    pub flags: i32,
    pub reserved0: i32,
}

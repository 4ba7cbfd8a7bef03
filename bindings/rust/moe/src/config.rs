//! Layer and step configuration: the C structs filled by their `*_init` functions (so every field
//! the builder leaves alone keeps the engine's default, 0 = default), set through typed setters.
use moe_sys as sys;

use crate::error::{check_no_context, Result};

/// Declares a C enum as a Rust enum with its code.
macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $code:path),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $var),* }
        impl $name {
            pub fn code(self) -> i32 {
                match self { $($name::$var => $code),* }
            }
        }
    };
}
pub(crate) use c_enum;

c_enum!(Activation { SwiGlu = sys::MOE_ACT_SWIGLU, GeGlu = sys::MOE_ACT_GEGLU, Gelu = sys::MOE_ACT_GELU,
                     Relu = sys::MOE_ACT_RELU, Silu = sys::MOE_ACT_SILU });
c_enum!(ScoreFunction { Softmax = sys::MOE_SCORE_SOFTMAX, SoftmaxPreTopk = sys::MOE_SCORE_SOFTMAX_PRE_TOPK,
                        Sigmoid = sys::MOE_SCORE_SIGMOID, SqrtSoftplus = sys::MOE_SCORE_SQRTSOFTPLUS });
c_enum!(AuxLoss { None = sys::MOE_AUX_NONE, Switch = sys::MOE_AUX_SWITCH, Sequence = sys::MOE_AUX_SEQUENCE,
                  Global = sys::MOE_AUX_GLOBAL });
c_enum!(DropPolicy { Probs = sys::MOE_DROP_PROBS, Position = sys::MOE_DROP_POSITION });
c_enum!(
    /// Parameter / activation precision (`MOE_DTYPE_*`).
    DType { Fp32 = sys::MOE_DTYPE_FP32, Bf16 = sys::MOE_DTYPE_BF16, Fp64 = sys::MOE_DTYPE_FP64 });
c_enum!(NonfinitePolicy { Reject = sys::MOE_NONFINITE_REJECT, Propagate = sys::MOE_NONFINITE_PROPAGATE });
c_enum!(
    /// Parameter slots (`MOE_PARAM_*`).
    Param { RouterWeight = sys::MOE_PARAM_ROUTER_WEIGHT, ExpertFc1 = sys::MOE_PARAM_EXPERT_FC1,
            ExpertFc2 = sys::MOE_PARAM_EXPERT_FC2, SharedFc1 = sys::MOE_PARAM_SHARED_FC1,
            SharedFc2 = sys::MOE_PARAM_SHARED_FC2, SharedGate = sys::MOE_PARAM_SHARED_GATE,
            ExpertBias = sys::MOE_PARAM_EXPERT_BIAS });
c_enum!(GradMode { Accumulate = sys::MOE_GRAD_ACCUMULATE, Overwrite = sys::MOE_GRAD_OVERWRITE });
c_enum!(StepMode { Train = sys::MOE_STEP_TRAIN, Eval = sys::MOE_STEP_EVAL, Recompute = sys::MOE_STEP_RECOMPUTE });
c_enum!(
    /// What `Step::export_routing` copies out (`MOE_ROUTING_*`).
    Routing { ExpertIndices = sys::MOE_ROUTING_EXPERT_INDICES, Probs = sys::MOE_ROUTING_PROBS,
              TokensPerExpert = sys::MOE_ROUTING_TOKENS_PER_EXPERT, KeptPerExpert = sys::MOE_ROUTING_KEPT_PER_EXPERT,
              DroppedMask = sys::MOE_ROUTING_DROPPED_MASK });
c_enum!(
    /// Whether a layer captures its calls as CUDA Graphs and replays them (`MOE_GRAPHS_*`).
    Graphs { Auto = sys::MOE_GRAPHS_AUTO, Off = sys::MOE_GRAPHS_OFF });
c_enum!(DispatcherKind { AllToAll = sys::MOE_DISPATCHER_ALL_TO_ALL, AllGather = sys::MOE_DISPATCHER_ALL_GATHER });

/// Generates chained setters that write one C field each.
macro_rules! setters {
    ($($(#[$m:meta])* $name:ident: $t:ty => |$c:ident, $v:ident| $body:expr;)*) => {$(
        $(#[$m])*
        pub fn $name(mut self, $v: $t) -> Self {
            let $c = &mut self.raw;
            $body;
            self
        }
    )*};
}
pub(crate) use setters;

/// `moe_layer_config`. `LayerConfig::new(H, F, E, K)` sets the required fields; the rest keep the
/// defaults of `moe_layer_config_init` until a setter changes them. The `f32` fields are read by the
/// library as the shortest decimal that rounds to them (`0.1` stays 0.1, not 0.100000001; abi/moe.h
/// "Float fields").
#[derive(Debug, Clone, Copy)]
pub struct LayerConfig {
    pub(crate) raw: sys::moe_layer_config,
}

impl LayerConfig {
    pub fn new(hidden_size: usize, ffn_hidden_size: usize, num_experts: usize, top_k: usize) -> LayerConfig {
        let mut raw = std::mem::MaybeUninit::<sys::moe_layer_config>::zeroed();
        let st = unsafe { sys::moe_layer_config_init(raw.as_mut_ptr(), std::mem::size_of::<sys::moe_layer_config>()) };
        assert_eq!(st, sys::MOE_OK, "moe_layer_config_init rejected sizeof(moe_layer_config)");
        let mut raw = unsafe { raw.assume_init() };
        // out-of-range values are passed on as they are: the engine's check names the field
        raw.hidden_size = i64::try_from(hidden_size).unwrap_or(i64::MAX);
        raw.ffn_hidden_size = i64::try_from(ffn_hidden_size).unwrap_or(i64::MAX);
        raw.num_experts = i32::try_from(num_experts).unwrap_or(i32::MAX);
        raw.top_k = i32::try_from(top_k).unwrap_or(i32::MAX);
        LayerConfig { raw }
    }

    setters! {
        hidden_size: i64 => |c, v| c.hidden_size = v;
        ffn_hidden_size: i64 => |c, v| c.ffn_hidden_size = v;
        num_experts: i32 => |c, v| c.num_experts = v;
        top_k: i32 => |c, v| c.top_k = v;
        activation: Activation => |c, v| c.activation = v.code();
        score_function: ScoreFunction => |c, v| c.score_function = v.code();
        /// Group-limited routing: `groups` groups, `keep` of them kept.
        group_limited: (i32, i32) => |c, v| { c.num_groups = v.0; c.group_topk = v.1 };
        scaling_factor: f32 => |c, v| c.scaling_factor = v;
        expert_bias: bool => |c, v| c.expert_bias = v as i32;
        bias_update_rate: f32 => |c, v| c.bias_update_rate = v;
        aux_loss: (AuxLoss, f32) => |c, v| { c.aux_loss_type = v.0.code(); c.aux_loss_coeff = v.1 };
        seq_length: i64 => |c, v| c.seq_length = v;
        z_loss_coeff: f32 => |c, v| c.z_loss_coeff = v;
        /// 0 = dropless
        capacity_factor: f32 => |c, v| c.capacity_factor = v;
        drop_policy: DropPolicy => |c, v| c.drop_policy = v.code();
        pad_to_capacity: bool => |c, v| c.pad_to_capacity = v as i32;
        shared_expert: (i64, bool) => |c, v| { c.shared_ffn_hidden_size = v.0; c.shared_gate = v.1 as i32 };
        param_dtype: DType => |c, v| c.param_dtype = v.code();
        nonfinite_policy: NonfinitePolicy => |c, v| c.nonfinite_policy = v.code();
        seed: u64 => |c, v| c.seed = v;
        /// CUDA Graphs for static-shape calls (default `Graphs::Auto`; no effect on CPU)
        graphs: Graphs => |c, v| c.graphs = v.code();
        /// what backward recomputes instead of keeping: a sum of `moe_sys::MOE_LAYER_RECOMPUTE_*`
        /// bits (0 = keep all); gradients are bitwise the same
        recompute: i32 => |c, v| c.recompute = v;
        /// saved activations moved to host memory between forward and backward: a sum of
        /// `moe_sys::MOE_LAYER_OFFLOAD_*` bits (0 = none); gradients are bitwise the same
        offload: i32 => |c, v| c.offload = v;
        /// low-precision recipe of the expert GEMMs: one of `moe_sys::MOE_QUANT_*` (0 = none)
        quant_recipe: i32 => |c, v| c.quant_recipe = v;
        /// saved activations kept in FP8 between forward and backward: a sum of
        /// `moe_sys::MOE_LAYER_FP8_STORE_*` bits (0 = none); gradients change within docs/memory.md's error
        fp8_storage: i32 => |c, v| c.fp8_storage = v;
    }

    /// The C struct (e.g. to read a resolved config from `Layer::config`).
    pub fn raw(&self) -> &sys::moe_layer_config {
        &self.raw
    }

    pub fn raw_mut(&mut self) -> &mut sys::moe_layer_config {
        &mut self.raw
    }
}

/// `moe_step_config`: the mode and the factor on aux / z-loss gradients.
///
/// `aux_loss_scale(s)` keeps the C default "0 = 1.0"; `explicit_aux_loss_scale(s)` uses `s` as given,
/// so `explicit_aux_loss_scale(0.0)` reports the aux and z-loss values (`Step::routing_stats`) while
/// adding nothing to any gradient. The later call wins.
#[derive(Debug, Clone, Copy)]
pub struct StepConfig {
    pub(crate) raw: sys::moe_step_config,
}

impl StepConfig {
    pub fn new(mode: StepMode) -> StepConfig {
        let mut raw = std::mem::MaybeUninit::<sys::moe_step_config>::zeroed();
        let st = unsafe { sys::moe_step_config_init(raw.as_mut_ptr(), std::mem::size_of::<sys::moe_step_config>()) };
        assert_eq!(st, sys::MOE_OK, "moe_step_config_init rejected sizeof(moe_step_config)");
        let mut raw = unsafe { raw.assume_init() };
        raw.mode = mode.code();
        StepConfig { raw }
    }

    setters! {
        mode: StepMode => |c, v| c.mode = v.code();
        /// factor on the aux / z-loss gradients; 0 = 1.0
        aux_loss_scale: f32 => |c, v| {
            c.aux_loss_scale = v;
            c.flags &= !sys::MOE_STEP_EXPLICIT_AUX_SCALE
        };
        /// factor on the aux / z-loss gradients, 0 included: 0 = the losses are reported but send no
        /// gradient (`MOE_STEP_EXPLICIT_AUX_SCALE`)
        explicit_aux_loss_scale: f32 => |c, v| {
            c.aux_loss_scale = v;
            c.flags |= sys::MOE_STEP_EXPLICIT_AUX_SCALE
        };
    }

    /// The C struct.
    pub fn raw(&self) -> &sys::moe_step_config {
        &self.raw
    }

    pub fn raw_mut(&mut self) -> &mut sys::moe_step_config {
        &mut self.raw
    }
}

impl Default for StepConfig {
    fn default() -> Self {
        StepConfig::new(StepMode::Train)
    }
}

/// Checks that a `*_init` accepts its struct (used by the other config types).
pub(crate) fn init_ok(code: i32) -> Result<()> {
    check_no_context(code)
}

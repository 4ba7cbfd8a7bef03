"""
    LibMoE

Julia binding of libmoe, the MoE layer training engine, through its C ABI (abi/moe.h).
Arrays cross as DLPack tensors with reversed shapes: a Julia (H, T) matrix is the C tensor [T, H].
Device memory (a CUDA context's tensors) crosses as a `DeviceArray`, by address; calls that the library
orders on a stream take a `stream` keyword (a `cudaStream_t`, passed through unchanged).
The library is found through `LIBMOE_PATH` (the file), `MOE_LIB_DIR` (its directory) or the system's
library path.
"""
module LibMoE

import Libdl

include("library.jl")
include("abi.jl")
include("abi_parallel.jl")
include("errors.jl")
include("introspect.jl")
include("dlpack.jl")
include("allocator.jl")
include("context.jl")
include("hooks.jl")
include("comm.jl")
include("layout.jl")
include("layer.jl")
include("params.jl")
include("step.jl")
include("dispatcher.jl")
include("plan.jl")
include("checkpoint.jl")

export MoeError, Context, Layer, Step, Dispatcher, Dispatch, TensorView, TrackingAllocator, RoutingStats, DeviceArray
export forward, forward!, backward, backward!, routing_stats, export_routing
export import_param!, export_param, export_param!, param_view, grad_view, array, has_param
export init_params!, zero_grad!, set_grad_mode!, expert_counts, expert_counts!, update_expert_bias!, config
export backward_data!, backward_data, backward_weights!, prefetch!, reset_global_aux!, reduce_grads!
export forward_backward!, modeled_comm
export NonfiniteReport, check_gradients
export Comm, CommHooks, Layout, LayerConfig, build_features, status_string, memory_stats, memory_trim!
export dispatch, dispatch_info, dispatch_rows, combine, combine_backward, dispatch_backward, local_experts
export dispatch_rows!, combine!, combine_backward!, dispatch_backward!
export PlanModel, PlanParallel, PlanResult, plan_preset, plan_estimate, plan_layer_estimate
export struct_size, enum_name, enum_value
export StateEntry, state_dict, attach_state!, detach_state!, companion, save_checkpoint, load_checkpoint!

# The library handle and resolved symbols are per process: never reuse ones from a precompile run.
function __init__()
    LIB_HANDLE[] = C_NULL
    LIB_PATH[] = ""
    empty!(SYMBOLS)
end

end # module

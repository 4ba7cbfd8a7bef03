# Finding and opening libmoe, and resolving its entry points.
#
# The library is opened at run time (not baked in at precompile time), so LIBMOE_PATH / MOE_LIB_DIR
# can change between sessions without a stale precompile cache pointing at an old file.

const LIB_HANDLE = Ref{Ptr{Cvoid}}(C_NULL)
const LIB_PATH = Ref{String}("")

# Every function the binding calls. All are resolved when the library is opened, so later lookups
# only read this Dict: finalizers that call destroy functions then never race with an insertion.
const SYMBOL_NAMES = (
    :moe_version_string, :moe_version_number, :moe_status_name, :moe_context_last_error,
    :moe_last_error, :moe_context_config_init, :moe_context_create, :moe_context_destroy,
    :moe_context_num_threads, :moe_context_memory_stats, :moe_context_memory_trim,
    :moe_layer_config_init, :moe_layer_create, :moe_layer_destroy, :moe_layer_get_config,
    :moe_layer_has_param, :moe_layer_param, :moe_layer_grad, :moe_layer_import_param,
    :moe_layer_export_param, :moe_layer_init_params, :moe_layer_zero_grad, :moe_layer_set_grad_mode,
    :moe_layer_expert_counts, :moe_layer_update_expert_bias,
    :moe_step_config_init, :moe_step_create, :moe_step_destroy, :moe_layer_forward, :moe_layer_backward,
    :moe_step_routing_stats, :moe_step_memory_stats, :moe_step_export_routing, :moe_step_prefetch,
    :moe_dispatcher_config_init, :moe_dispatcher_create, :moe_dispatcher_local_experts,
    :moe_dispatcher_destroy, :moe_dispatcher_dispatch, :moe_dispatch_info, :moe_dispatch_rows,
    :moe_dispatch_combine, :moe_dispatch_combine_backward, :moe_dispatch_backward, :moe_dispatch_destroy,
    :moe_build_features, :moe_status_string, :moe_layer_backward_data, :moe_layer_backward_weights,
    :moe_layer_reset_global_aux,
    :moe_comm_config_init, :moe_comm_create_self, :moe_comm_create_hooks, :moe_comm_destroy, :moe_comm_kind,
    :moe_comm_rank, :moe_comm_size, :moe_comm_split, :moe_comm_split_layout,
    :moe_layout_config_init, :moe_layout_create, :moe_layout_destroy, :moe_layout_group, :moe_layout_sizes,
    :moe_parallel_config_init, :moe_layer_create_parallel, :moe_layer_reduce_grads,
    :moe_plan_model_init, :moe_plan_parallel_init, :moe_plan_model_preset, :moe_plan_estimate,
    :moe_plan_layer_estimate,
    :moe_struct_size, :moe_enum_name, :moe_enum_value, :moe_routing_stats_init, :moe_memory_stats_init,
    :moe_plan_result_init, :moe_nonfinite_report_init, :moe_layer_check_gradients,
    :moe_state_entry_init, :moe_layer_state_count, :moe_layer_state_entry, :moe_layer_attach_state,
    :moe_layer_detach_state, :moe_checkpoint_config_init, :moe_layer_save, :moe_layer_load,
    :moe_merged_step_init, :moe_layer_forward_backward, :moe_comm_create_modeled,
)
const SYMBOLS = Dict{Symbol,Ptr{Cvoid}}()

# Candidate files, most explicit first: LIBMOE_PATH (the file), MOE_LIB_DIR (its directory), then the
# system's library search path (an installed prefix).
function library_candidates()
    found = String[]
    path = get(ENV, "LIBMOE_PATH", "")
    isempty(path) || push!(found, path)
    dir = get(ENV, "MOE_LIB_DIR", "")
    if !isempty(dir)
        push!(found, joinpath(dir, "libmoe.so.0"), joinpath(dir, "libmoe.so"))
    end
    installed = Libdl.find_library(["libmoe.so.0", "libmoe"])
    isempty(installed) || push!(found, installed)
    found
end

function open_library()
    LIB_HANDLE[] != C_NULL && return LIB_HANDLE[]
    tried = library_candidates()
    for path in tried
        h = Libdl.dlopen(path, Libdl.RTLD_LAZY | Libdl.RTLD_LOCAL; throw_error = false)
        h === nothing && continue
        for name in SYMBOL_NAMES
            # Missing entry points stay C_NULL: calling one reports MOE_ERR_UNSUPPORTED (an older libmoe).
            SYMBOLS[name] = something(Libdl.dlsym(h, name; throw_error = false), C_NULL)
        end
        LIB_PATH[] = path
        LIB_HANDLE[] = h
        return h
    end
    error("libmoe not found (tried: ", isempty(tried) ? "nothing" : join(tried, ", "),
          "); set LIBMOE_PATH to the libmoe.so file or MOE_LIB_DIR to its directory, or install libmoe")
end

"""
    library_path() -> String

The libmoe file this session opened (opening it if needed).
"""
library_path() = (open_library(); LIB_PATH[])

# The address of a libmoe function, for `@ccall \$(fn(:name))(...)`.
function fn(name::Symbol)
    open_library()
    p = get(SYMBOLS, name, C_NULL)
    p == C_NULL && throw(MoeError(MOE_ERR_UNSUPPORTED, "MOE_ERR_UNSUPPORTED",
                                  "$(LIB_PATH[]) has no function $name (an older libmoe?)"))
    p
end

"""
    version() -> VersionNumber

The version of the libmoe that was opened (`moe_version_string`).
"""
version() = VersionNumber(unsafe_string(@ccall $(fn(:moe_version_string))()::Cstring))

"""
    build_features() -> UInt64

What this libmoe build supports (`moe_build_features`): an OR of `FEATURE_CPU`, `FEATURE_OPENMP`,
`FEATURE_OPENBLAS`, `FEATURE_ONEDNN`, `FEATURE_BF16`, `FEATURE_FP64`, `FEATURE_CUDA`, `FEATURE_NCCL`,
`FEATURE_MPI`, `FEATURE_FP8`. Test one with `build_features() & LibMoE.FEATURE_MPI != 0`.
"""
build_features() = @ccall $(fn(:moe_build_features))()::UInt64

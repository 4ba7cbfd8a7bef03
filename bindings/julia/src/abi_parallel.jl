# Constants and structs of abi/moe.h's 0.2 parts: build features, communicators, Parallel Folding
# layouts and parallel layers. Mirrored field for field like abi.jl (the tests check the sizes).

# Bits of moe_build_features().
const FEATURE_CPU = UInt64(1) << 0
const FEATURE_OPENMP = UInt64(1) << 1
const FEATURE_OPENBLAS = UInt64(1) << 2
const FEATURE_ONEDNN = UInt64(1) << 3
const FEATURE_BF16 = UInt64(1) << 4
const FEATURE_FP64 = UInt64(1) << 5
const FEATURE_CUDA = UInt64(1) << 8
const FEATURE_NCCL = UInt64(1) << 9
const FEATURE_MPI = UInt64(1) << 10
const FEATURE_FP8 = UInt64(1) << 11

# Communicator kinds, and the extra reduction dtype of the hooks.
const COMM_SELF = Int32(0)
const COMM_MPI = Int32(1)
const COMM_NCCL = Int32(2)
const COMM_HOOKS = Int32(3)
const COMM_MODELED = Int32(4)  # an interconnect modeled over a host comm (modeled_comm)
const DTYPE_INT64 = Int32(3)

# Layout groups (moe_layout_group, moe_comm_split_layout).
const GROUP_TP = Int32(0)
const GROUP_CP = Int32(1)
const GROUP_DP = Int32(2)
const GROUP_PP = Int32(3)
const GROUP_ETP = Int32(4)
const GROUP_EP = Int32(5)
const GROUP_EDP = Int32(6)
const GROUP_DP_CP = Int32(7)
const GROUP_TP_CP = Int32(8)
const GROUP_TP_CP_DP = Int32(9)

mutable struct CommConfig
    struct_size::UInt32
    api_version::UInt32
    next::Ptr{Cvoid}
    timeout_ms::Int32
    reserved0::Int32
end

# moe_comm_hooks: the C table a hooks Comm hands the library (the Julia side is CommHooks).
struct CommHooksTable
    struct_size::UInt32
    rank::Int32
    size::Int32
    reserved0::Int32
    user_data::Ptr{Cvoid}
    all_to_all_v::Ptr{Cvoid}
    all_gather_v::Ptr{Cvoid}
    all_reduce::Ptr{Cvoid}
    broadcast::Ptr{Cvoid}
    barrier::Ptr{Cvoid}
    release::Ptr{Cvoid}
end

mutable struct LayoutConfig
    struct_size::UInt32
    api_version::UInt32
    next::Ptr{Cvoid}
    world_size::Int32
    tp::Int32
    cp::Int32
    dp::Int32
    pp::Int32
    etp::Int32
    ep::Int32
    order::Ptr{UInt8}
end

mutable struct ParallelConfig
    struct_size::UInt32
    api_version::UInt32
    next::Ptr{Cvoid}
    ep_comm::Ptr{Cvoid}
    etp_comm::Ptr{Cvoid}
    aux_comm::Ptr{Cvoid}
    edp_comm::Ptr{Cvoid}
    dp_comm::Ptr{Cvoid}
    bias_comm::Ptr{Cvoid}
    dispatcher::Int32
    num_chunks::Int32
end

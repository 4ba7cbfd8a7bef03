# Introspection (abi/moe.h, "introspection"): the loaded library's struct sizes and the names of its
# constants, and the zeroed output structs its *_init functions make.

"""
    struct_size(kind) -> (size, min_size)

The size of the struct `kind` (`STRUCT_LAYER_CONFIG`, ...) in the loaded library, and its size in the
struct's first release, the smallest `struct_size` the library accepts (`moe_struct_size`). The
binding's mirrors (`sizeof(LibMoE.LayerConfig)`, ...) equal `size` for the library they were written for;
an older library reports less (the binding's extra fields must then stay zero). An unknown `kind`
throws a `MoeError`.
"""
function struct_size(kind::Integer)
    size = Ref{Csize_t}(0)
    min_size = Ref{Csize_t}(0)
    check(@ccall $(fn(:moe_struct_size))(Int32(kind)::Int32, size::Ref{Csize_t}, min_size::Ref{Csize_t})::Int32)
    (Int(size[]), Int(min_size[]))
end

"""
    enum_name(family, value) -> Union{String, Nothing}

The name of the constant `value` in `family` (`ENUM_PARAM`, `ENUM_ACTIVATION`, ...) as abi/moe.h spells
it, e.g. `enum_name(ENUM_PARAM, 1) == "MOE_PARAM_EXPERT_FC1"` (`moe_enum_name`); `nothing` when the
family has no such value (counts, combinations of bits, a newer library's constants).
"""
function enum_name(family::Integer, value::Integer)
    p = @ccall $(fn(:moe_enum_name))(Int32(family)::Int32, Int64(value)::Int64)::Ptr{UInt8}
    p == C_NULL ? nothing : unsafe_string(p)
end

"""
    enum_value(family, name) -> Int64

The value of the constant named `name` (the full name, "MOE_ACT_GELU") in `family` (`moe_enum_value`);
throws a `MoeError` naming the argument when there is none.
"""
function enum_value(family::Integer, name::AbstractString)
    v = Ref{Int64}(0)
    check(@ccall $(fn(:moe_enum_value))(Int32(family)::Int32, name::Cstring, v::Ref{Int64})::Int32)
    v[]
end

# An output struct (stats, plan result) made by the library's own *_init: struct_size set, rest zero.
function blank_output(::Type{T}, init::Symbol) where {T}
    out = Ref{T}()
    check(@ccall $(fn(init))(out::Ref{T}, sizeof(T)::Csize_t)::Int32)
    out
end

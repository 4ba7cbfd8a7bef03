package moe

/*
#include "shim.h"
*/
import "C"

import "unsafe"

// StructKind is a MOE_STRUCT_* value: a struct with struct_size.
type StructKind int32

// The structs StructSize knows.
const (
	StructContextConfig    StructKind = C.MOE_STRUCT_CONTEXT_CONFIG
	StructAllocator        StructKind = C.MOE_STRUCT_ALLOCATOR
	StructLogger           StructKind = C.MOE_STRUCT_LOGGER
	StructProfiler         StructKind = C.MOE_STRUCT_PROFILER
	StructMemoryStats      StructKind = C.MOE_STRUCT_MEMORY_STATS
	StructLayerConfig      StructKind = C.MOE_STRUCT_LAYER_CONFIG
	StructStepConfig       StructKind = C.MOE_STRUCT_STEP_CONFIG
	StructRoutingStats     StructKind = C.MOE_STRUCT_ROUTING_STATS
	StructCommConfig       StructKind = C.MOE_STRUCT_COMM_CONFIG
	StructCommHooks        StructKind = C.MOE_STRUCT_COMM_HOOKS
	StructLayoutConfig     StructKind = C.MOE_STRUCT_LAYOUT_CONFIG
	StructParallelConfig   StructKind = C.MOE_STRUCT_PARALLEL_CONFIG
	StructDispatcherConfig StructKind = C.MOE_STRUCT_DISPATCHER_CONFIG
	StructPlanModel        StructKind = C.MOE_STRUCT_PLAN_MODEL
	StructPlanParallel     StructKind = C.MOE_STRUCT_PLAN_PARALLEL
	StructPlanResult       StructKind = C.MOE_STRUCT_PLAN_RESULT
	StructNonfiniteReport  StructKind = C.MOE_STRUCT_NONFINITE_REPORT
	StructStateEntry       StructKind = C.MOE_STRUCT_STATE_ENTRY
	StructCheckpointConfig StructKind = C.MOE_STRUCT_CHECKPOINT_CONFIG
	StructMergedStep       StructKind = C.MOE_STRUCT_MERGED_STEP
)

// headerSizes are the sizes this package was compiled with (the abi/moe.h cgo read).
var headerSizes = map[StructKind]int{
	StructContextConfig:    C.sizeof_moe_context_config,
	StructAllocator:        C.sizeof_moe_allocator,
	StructLogger:           C.sizeof_moe_logger,
	StructProfiler:         C.sizeof_moe_profiler,
	StructMemoryStats:      C.sizeof_moe_memory_stats,
	StructLayerConfig:      C.sizeof_moe_layer_config,
	StructStepConfig:       C.sizeof_moe_step_config,
	StructRoutingStats:     C.sizeof_moe_routing_stats,
	StructCommConfig:       C.sizeof_moe_comm_config,
	StructCommHooks:        C.sizeof_moe_comm_hooks,
	StructLayoutConfig:     C.sizeof_moe_layout_config,
	StructParallelConfig:   C.sizeof_moe_parallel_config,
	StructDispatcherConfig: C.sizeof_moe_dispatcher_config,
	StructPlanModel:        C.sizeof_moe_plan_model,
	StructPlanParallel:     C.sizeof_moe_plan_parallel,
	StructPlanResult:       C.sizeof_moe_plan_result,
	StructNonfiniteReport:  C.sizeof_moe_nonfinite_report,
	StructStateEntry:       C.sizeof_moe_state_entry,
	StructCheckpointConfig: C.sizeof_moe_checkpoint_config,
	StructMergedStep:       C.sizeof_moe_merged_step,
}

// HeaderStructSize is the size of kind in the header this package was compiled against (0 for a
// kind it does not know); compare it with StructSize to tell an older or newer library.
func HeaderStructSize(kind StructKind) int { return headerSizes[kind] }

// StructSize asks the loaded library (moe_struct_size) for the size of kind and for the size in the
// struct's first release, the smallest struct_size it accepts.
func StructSize(kind StructKind) (size, minSize int, err error) {
	var s, m C.size_t
	if err := callC(func() C.int32_t { return C.moe_struct_size(C.int32_t(kind), &s, &m) }); err != nil {
		return 0, 0, err
	}
	return int(s), int(m), nil
}

// EnumFamily is a MOE_ENUM_* value: a family of constants of abi/moe.h.
type EnumFamily int32

// The families EnumName and EnumValue know.
const (
	EnumFamilies       EnumFamily = C.MOE_ENUM_FAMILY
	EnumStatus         EnumFamily = C.MOE_ENUM_STATUS
	EnumFeature        EnumFamily = C.MOE_ENUM_FEATURE
	EnumLogLevel       EnumFamily = C.MOE_ENUM_LOG_LEVEL
	EnumDevice         EnumFamily = C.MOE_ENUM_DEVICE
	EnumMem            EnumFamily = C.MOE_ENUM_MEM
	EnumActivation     EnumFamily = C.MOE_ENUM_ACTIVATION
	EnumScore          EnumFamily = C.MOE_ENUM_SCORE
	EnumAux            EnumFamily = C.MOE_ENUM_AUX
	EnumDrop           EnumFamily = C.MOE_ENUM_DROP
	EnumDType          EnumFamily = C.MOE_ENUM_DTYPE
	EnumNonfinite      EnumFamily = C.MOE_ENUM_NONFINITE
	EnumGraphs         EnumFamily = C.MOE_ENUM_GRAPHS
	EnumLayerRecompute EnumFamily = C.MOE_ENUM_LAYER_RECOMPUTE
	EnumLayerOffload   EnumFamily = C.MOE_ENUM_LAYER_OFFLOAD
	EnumQuant          EnumFamily = C.MOE_ENUM_QUANT
	EnumLayerFP8Store  EnumFamily = C.MOE_ENUM_LAYER_FP8_STORE
	EnumParam          EnumFamily = C.MOE_ENUM_PARAM
	EnumGradMode       EnumFamily = C.MOE_ENUM_GRAD_MODE
	EnumStepMode       EnumFamily = C.MOE_ENUM_STEP_MODE
	EnumStepFlag       EnumFamily = C.MOE_ENUM_STEP_FLAG
	EnumRouting        EnumFamily = C.MOE_ENUM_ROUTING
	EnumComm           EnumFamily = C.MOE_ENUM_COMM
	EnumGroup          EnumFamily = C.MOE_ENUM_GROUP
	EnumDispatcher     EnumFamily = C.MOE_ENUM_DISPATCHER
	EnumCombine        EnumFamily = C.MOE_ENUM_COMBINE
	EnumPlanAttn       EnumFamily = C.MOE_ENUM_PLAN_ATTN
	EnumPlanRecompute  EnumFamily = C.MOE_ENUM_PLAN_RECOMPUTE
	EnumPlanOffload    EnumFamily = C.MOE_ENUM_PLAN_OFFLOAD
	EnumPlanCategory   EnumFamily = C.MOE_ENUM_PLAN_CATEGORY
	EnumPlanComm       EnumFamily = C.MOE_ENUM_PLAN_COMM
	EnumStruct         EnumFamily = C.MOE_ENUM_STRUCT
	EnumNonfiniteKind  EnumFamily = C.MOE_ENUM_NONFINITE_KIND
	EnumState          EnumFamily = C.MOE_ENUM_STATE
	EnumCheckpoint     EnumFamily = C.MOE_ENUM_CHECKPOINT
	EnumMerged         EnumFamily = C.MOE_ENUM_MERGED
)

// EnumName is the name of the constant value in family as abi/moe.h spells it (moe_enum_name), e.g.
// EnumName(EnumParam, int64(ParamExpertFC1)) = "MOE_PARAM_EXPERT_FC1"; ok is false when the family
// has no such value (counts, combinations of bits, a newer library's constants).
func EnumName(family EnumFamily, value int64) (name string, ok bool) {
	p := C.moe_enum_name(C.int32_t(family), C.int64_t(value))
	if p == nil {
		return "", false
	}
	return C.GoString(p), true
}

// EnumValue is the value of the constant named name (the full name, "MOE_ACT_GELU") in family
// (moe_enum_value).
func EnumValue(family EnumFamily, name string) (int64, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var v C.int64_t
	if err := callC(func() C.int32_t { return C.moe_enum_value(C.int32_t(family), cname, &v) }); err != nil {
		return 0, err
	}
	return int64(v), nil
}

package moe

/*
#include "shim.h"
*/
import "C"

// Activation is a MOE_ACT_* value.
type Activation int32

// Expert activations; the gated ones (SwiGLU, GeGLU) make FC1 2F x H.
const (
	ActSwiGLU Activation = C.MOE_ACT_SWIGLU
	ActGeGLU  Activation = C.MOE_ACT_GEGLU
	ActGELU   Activation = C.MOE_ACT_GELU
	ActReLU   Activation = C.MOE_ACT_RELU
	ActSiLU   Activation = C.MOE_ACT_SILU
)

// ScoreFunction is a MOE_SCORE_* value.
type ScoreFunction int32

// Router score functions.
const (
	ScoreSoftmax        ScoreFunction = C.MOE_SCORE_SOFTMAX
	ScoreSoftmaxPreTopK ScoreFunction = C.MOE_SCORE_SOFTMAX_PRE_TOPK
	ScoreSigmoid        ScoreFunction = C.MOE_SCORE_SIGMOID
	ScoreSqrtSoftplus   ScoreFunction = C.MOE_SCORE_SQRTSOFTPLUS
)

// AuxLoss is a MOE_AUX_* value.
type AuxLoss int32

// Load-balancing auxiliary losses.
const (
	AuxNone     AuxLoss = C.MOE_AUX_NONE
	AuxSwitch   AuxLoss = C.MOE_AUX_SWITCH
	AuxSequence AuxLoss = C.MOE_AUX_SEQUENCE
	AuxGlobal   AuxLoss = C.MOE_AUX_GLOBAL
)

// DropPolicy is a MOE_DROP_* value.
type DropPolicy int32

// What capacity dropping keeps.
const (
	DropProbs    DropPolicy = C.MOE_DROP_PROBS
	DropPosition DropPolicy = C.MOE_DROP_POSITION
)

// DType is a MOE_DTYPE_* value: the precision of parameters, dispatched rows or a reduction.
type DType int32

// Data types.
const (
	DTypeFloat32  DType = C.MOE_DTYPE_FP32
	DTypeBFloat16 DType = C.MOE_DTYPE_BF16
	DTypeFloat64  DType = C.MOE_DTYPE_FP64
	DTypeInt64    DType = C.MOE_DTYPE_INT64 // reductions only
)

// size is the element size in bytes (0 for an unknown DType).
func (d DType) size() int {
	switch d {
	case DTypeFloat32:
		return 4
	case DTypeBFloat16:
		return 2
	case DTypeFloat64, DTypeInt64:
		return 8
	}
	return 0
}

// NonfinitePolicy is a MOE_NONFINITE_* value.
type NonfinitePolicy int32

// What forward and backward do with NaN/Inf inputs.
const (
	NonfiniteReject    NonfinitePolicy = C.MOE_NONFINITE_REJECT
	NonfinitePropagate NonfinitePolicy = C.MOE_NONFINITE_PROPAGATE
)

// GraphsMode is a MOE_GRAPHS_* value: whether a layer captures its calls as CUDA Graphs.
type GraphsMode int32

// CUDA Graphs modes (no effect on CPU).
const (
	GraphsAuto GraphsMode = C.MOE_GRAPHS_AUTO // capture and replay where shapes are static
	GraphsOff  GraphsMode = C.MOE_GRAPHS_OFF
)

// Recompute bits of LayerConfig.Recompute: what backward recomputes instead of keeping from forward
// (gradients stay bitwise the same).
const (
	RecomputeExpertFC1 int32 = C.MOE_LAYER_RECOMPUTE_EXPERT_FC1 // the experts' FC1 output
	RecomputeRouter    int32 = C.MOE_LAYER_RECOMPUTE_ROUTER     // the router logits
	RecomputeExpertMLP int32 = C.MOE_LAYER_RECOMPUTE_EXPERT_MLP // FC1 output and expert input rows (one rank)
)

// Offload bits of LayerConfig.Offload: saved activations moved to host memory between forward and
// backward (gradients stay bitwise the same).
const (
	OffloadExpertFC1   int32 = C.MOE_LAYER_OFFLOAD_EXPERT_FC1
	OffloadExpertInput int32 = C.MOE_LAYER_OFFLOAD_EXPERT_INPUT
	OffloadRouter      int32 = C.MOE_LAYER_OFFLOAD_ROUTER
	OffloadInput       int32 = C.MOE_LAYER_OFFLOAD_INPUT
)

// QuantRecipe is LayerConfig.QuantRecipe, the low-precision recipe of the expert GEMMs (MOE_QUANT_*).
type QuantRecipe int32

const (
	QuantNone          QuantRecipe = C.MOE_QUANT_NONE
	QuantFP8Tensorwise QuantRecipe = C.MOE_QUANT_FP8_TENSORWISE // E4M3 / E5M2 gradients, per-tensor scales
	QuantFP8Blockwise  QuantRecipe = C.MOE_QUANT_FP8_BLOCKWISE  // E4M3, 1x128 activations, 128x128 weights
	QuantMXFP8         QuantRecipe = C.MOE_QUANT_MXFP8          // E4M3 in 32-element E8M0-scaled blocks
	QuantNVFP4         QuantRecipe = C.MOE_QUANT_NVFP4          // E2M1 in 16-element E4M3-scaled blocks
)

// FP8 storage bits of LayerConfig.FP8Storage: saved activations kept in FP8 between forward and
// backward (gradients change within the error docs/memory.md measures).
const (
	FP8StoreExpertFC1   int32 = C.MOE_LAYER_FP8_STORE_EXPERT_FC1
	FP8StoreExpertInput int32 = C.MOE_LAYER_FP8_STORE_EXPERT_INPUT
)

// LayerConfig mirrors moe_layer_config (abi/moe.h documents each field); zero means the default.
// HiddenSize, FFNHiddenSize, NumExperts and TopK are required. The float32 fields are read by the
// library as the shortest decimal that rounds to them (0.1 stays 0.1, not 0.100000001; abi/moe.h
// "Float fields").
type LayerConfig struct {
	HiddenSize          int64
	FFNHiddenSize       int64
	NumExperts          int32
	TopK                int32
	Activation          Activation
	ScoreFunction       ScoreFunction
	NumGroups           int32
	GroupTopK           int32
	ScalingFactor       float32 // 0 = 1.0
	ExpertBias          bool    // aux-loss-free expert bias (sigmoid / sqrtsoftplus only)
	BiasUpdateRate      float32 // 0 = 1e-3
	AuxLossType         AuxLoss
	AuxLossCoeff        float32
	SeqLength           int64
	ZLossCoeff          float32
	CapacityFactor      float32 // 0 = dropless
	DropPolicy          DropPolicy
	PadToCapacity       bool
	SharedFFNHiddenSize int64 // 0 = no shared expert
	SharedGate          bool
	ParamDType          DType
	NonfinitePolicy     NonfinitePolicy
	Seed                uint64
	Graphs              GraphsMode  // CUDA Graphs capture and replay (no effect on CPU)
	Recompute           int32       // Recompute* bits; 0 = keep everything
	Offload             int32       // Offload* bits; 0 = keep everything on the device
	QuantRecipe         QuantRecipe // low-precision expert GEMMs; 0 = none
	FP8Storage          int32       // FP8Store* bits; 0 = keep saved activations in the compute dtype
}

// NewLayerConfig returns the defaults of moe_layer_config_init.
func NewLayerConfig() LayerConfig {
	var c C.moe_layer_config
	C.moe_layer_config_init(&c, C.sizeof_moe_layer_config)
	return layerConfigFromC(&c)
}

func boolInt(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// toC fills a C config through moe_layer_config_init, which writes the header.
func (g *LayerConfig) toC() C.moe_layer_config {
	var c C.moe_layer_config
	C.moe_layer_config_init(&c, C.sizeof_moe_layer_config)
	c.hidden_size = C.int64_t(g.HiddenSize)
	c.ffn_hidden_size = C.int64_t(g.FFNHiddenSize)
	c.num_experts = C.int32_t(g.NumExperts)
	c.top_k = C.int32_t(g.TopK)
	c.activation = C.int32_t(g.Activation)
	c.score_function = C.int32_t(g.ScoreFunction)
	c.num_groups = C.int32_t(g.NumGroups)
	c.group_topk = C.int32_t(g.GroupTopK)
	c.scaling_factor = C.float(g.ScalingFactor)
	c.expert_bias = boolInt(g.ExpertBias)
	c.bias_update_rate = C.float(g.BiasUpdateRate)
	c.aux_loss_type = C.int32_t(g.AuxLossType)
	c.aux_loss_coeff = C.float(g.AuxLossCoeff)
	c.seq_length = C.int64_t(g.SeqLength)
	c.z_loss_coeff = C.float(g.ZLossCoeff)
	c.capacity_factor = C.float(g.CapacityFactor)
	c.drop_policy = C.int32_t(g.DropPolicy)
	c.pad_to_capacity = boolInt(g.PadToCapacity)
	c.shared_ffn_hidden_size = C.int64_t(g.SharedFFNHiddenSize)
	c.shared_gate = boolInt(g.SharedGate)
	c.param_dtype = C.int32_t(g.ParamDType)
	c.nonfinite_policy = C.int32_t(g.NonfinitePolicy)
	c.seed = C.uint64_t(g.Seed)
	c.graphs = C.int32_t(g.Graphs)
	c.recompute = C.int32_t(g.Recompute)
	c.offload = C.int32_t(g.Offload)
	c.quant_recipe = C.int32_t(g.QuantRecipe)
	c.fp8_storage = C.int32_t(g.FP8Storage)
	return c
}

func layerConfigFromC(c *C.moe_layer_config) LayerConfig {
	return LayerConfig{
		HiddenSize:          int64(c.hidden_size),
		FFNHiddenSize:       int64(c.ffn_hidden_size),
		NumExperts:          int32(c.num_experts),
		TopK:                int32(c.top_k),
		Activation:          Activation(c.activation),
		ScoreFunction:       ScoreFunction(c.score_function),
		NumGroups:           int32(c.num_groups),
		GroupTopK:           int32(c.group_topk),
		ScalingFactor:       float32(c.scaling_factor),
		ExpertBias:          c.expert_bias != 0,
		BiasUpdateRate:      float32(c.bias_update_rate),
		AuxLossType:         AuxLoss(c.aux_loss_type),
		AuxLossCoeff:        float32(c.aux_loss_coeff),
		SeqLength:           int64(c.seq_length),
		ZLossCoeff:          float32(c.z_loss_coeff),
		CapacityFactor:      float32(c.capacity_factor),
		DropPolicy:          DropPolicy(c.drop_policy),
		PadToCapacity:       c.pad_to_capacity != 0,
		SharedFFNHiddenSize: int64(c.shared_ffn_hidden_size),
		SharedGate:          c.shared_gate != 0,
		ParamDType:          DType(c.param_dtype),
		NonfinitePolicy:     NonfinitePolicy(c.nonfinite_policy),
		Seed:                uint64(c.seed),
		Graphs:              GraphsMode(c.graphs),
		Recompute:           int32(c.recompute),
		Offload:             int32(c.offload),
		QuantRecipe:         QuantRecipe(c.quant_recipe),
		FP8Storage:          int32(c.fp8_storage),
	}
}

package moe

/*
#include "shim.h"
*/
import "C"

import "unsafe"

// PlanModel mirrors moe_plan_model: a model for the memory planner (docs/planner.md). Zero means
// unset / the default.
type PlanModel struct {
	NumLayers, FirstDenseLayers, MoELayerFreq int32
	NumExperts, TopK, NumSharedExperts        int32
	HiddenSize, FFNHiddenSize                 int64
	MoEFFNHiddenSize, SharedFFNHiddenSize     int64
	VocabSize                                 int64
	Activation, TiedEmbeddings, Attention     int32 // Attention: PlanAttnGQA or PlanAttnMLA
	NumHeads, NumKVHeads, HeadDim             int32
	QLoraRank, KVLoraRank, QKRopeHeadDim      int32
	VHeadDim                                  int32
}

// PlanParallel mirrors moe_plan_parallel: the parallel layout and training policies.
type PlanParallel struct {
	TP, CP, DP, PP, VPP, EP, ETP int32
	MicroBatch                   int32
	SeqLength                    int64
	NumMicroBatches              int32
	ParamBytes, GradBytes        int32
	OptimizerBytes               int32
	ActivationBytes              int32
	DistributedOptimizer         int32
	Recompute                    int32 // Recompute*
	Offload                      int32 // Offload* bits
	DeviceMemoryBytes            int64
}

// PlanResult mirrors moe_plan_result: per-GPU bytes by Plan* category, per-step bytes sent by
// PlanComm* group, and the fit check (1 fits, 0 not, -1 not checked).
type PlanResult struct {
	Stage             int32
	Bytes             [C.MOE_PLAN_NUM_CATEGORIES]int64
	TotalBytes        int64
	DeviceMemoryBytes int64
	Fits              int32
	CommBytes         [C.MOE_PLAN_COMM_NUM]int64
	ParamsTotal       int64
	ParamsPerGPU      int64
}

// Planner constants.
const (
	PlanAttnGQA        = C.MOE_PLAN_ATTN_GQA
	PlanAttnMLA        = C.MOE_PLAN_ATTN_MLA
	RecomputeNone      = C.MOE_RECOMPUTE_NONE
	RecomputeSelective = C.MOE_RECOMPUTE_SELECTIVE
	RecomputeFull      = C.MOE_RECOMPUTE_FULL
	OffloadOptimizer   = C.MOE_OFFLOAD_OPTIMIZER
	OffloadActivations = C.MOE_OFFLOAD_ACTIVATIONS
	PlanWeights        = C.MOE_PLAN_WEIGHTS
	PlanGrads          = C.MOE_PLAN_GRADS
	PlanOptimizer      = C.MOE_PLAN_OPTIMIZER
	PlanActivations    = C.MOE_PLAN_ACTIVATIONS
	PlanCommBuffers    = C.MOE_PLAN_COMM_BUFFERS
	PlanWorkspace      = C.MOE_PLAN_WORKSPACE
	PlanCommEP         = C.MOE_PLAN_COMM_EP
	PlanCommTP         = C.MOE_PLAN_COMM_TP
	PlanCommCP         = C.MOE_PLAN_COMM_CP
	PlanCommDP         = C.MOE_PLAN_COMM_DP
	PlanCommEDP        = C.MOE_PLAN_COMM_EDP
	PlanCommPP         = C.MOE_PLAN_COMM_PP
)

func (m *PlanModel) toC() C.moe_plan_model {
	var c C.moe_plan_model
	C.moe_plan_model_init(&c, C.sizeof_moe_plan_model)
	c.num_layers, c.first_dense_layers, c.moe_layer_freq = C.int32_t(m.NumLayers), C.int32_t(m.FirstDenseLayers), C.int32_t(m.MoELayerFreq)
	c.num_experts, c.top_k, c.num_shared_experts = C.int32_t(m.NumExperts), C.int32_t(m.TopK), C.int32_t(m.NumSharedExperts)
	c.hidden_size, c.ffn_hidden_size = C.int64_t(m.HiddenSize), C.int64_t(m.FFNHiddenSize)
	c.moe_ffn_hidden_size, c.shared_ffn_hidden_size = C.int64_t(m.MoEFFNHiddenSize), C.int64_t(m.SharedFFNHiddenSize)
	c.vocab_size = C.int64_t(m.VocabSize)
	c.activation, c.tied_embeddings, c.attention = C.int32_t(m.Activation), C.int32_t(m.TiedEmbeddings), C.int32_t(m.Attention)
	c.num_heads, c.num_kv_heads, c.head_dim = C.int32_t(m.NumHeads), C.int32_t(m.NumKVHeads), C.int32_t(m.HeadDim)
	c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim = C.int32_t(m.QLoraRank), C.int32_t(m.KVLoraRank), C.int32_t(m.QKRopeHeadDim)
	c.v_head_dim = C.int32_t(m.VHeadDim)
	return c
}

func planModelFromC(c *C.moe_plan_model) PlanModel {
	return PlanModel{NumLayers: int32(c.num_layers), FirstDenseLayers: int32(c.first_dense_layers),
		MoELayerFreq: int32(c.moe_layer_freq), NumExperts: int32(c.num_experts), TopK: int32(c.top_k),
		NumSharedExperts: int32(c.num_shared_experts), HiddenSize: int64(c.hidden_size),
		FFNHiddenSize: int64(c.ffn_hidden_size), MoEFFNHiddenSize: int64(c.moe_ffn_hidden_size),
		SharedFFNHiddenSize: int64(c.shared_ffn_hidden_size), VocabSize: int64(c.vocab_size),
		Activation: int32(c.activation), TiedEmbeddings: int32(c.tied_embeddings), Attention: int32(c.attention),
		NumHeads: int32(c.num_heads), NumKVHeads: int32(c.num_kv_heads), HeadDim: int32(c.head_dim),
		QLoraRank: int32(c.q_lora_rank), KVLoraRank: int32(c.kv_lora_rank), QKRopeHeadDim: int32(c.qk_rope_head_dim),
		VHeadDim: int32(c.v_head_dim)}
}

func (p *PlanParallel) toC() C.moe_plan_parallel {
	var c C.moe_plan_parallel
	C.moe_plan_parallel_init(&c, C.sizeof_moe_plan_parallel)
	c.tp, c.cp, c.dp, c.pp = C.int32_t(p.TP), C.int32_t(p.CP), C.int32_t(p.DP), C.int32_t(p.PP)
	c.vpp, c.ep, c.etp, c.micro_batch = C.int32_t(p.VPP), C.int32_t(p.EP), C.int32_t(p.ETP), C.int32_t(p.MicroBatch)
	c.seq_length, c.num_micro_batches = C.int64_t(p.SeqLength), C.int32_t(p.NumMicroBatches)
	c.param_bytes, c.grad_bytes = C.int32_t(p.ParamBytes), C.int32_t(p.GradBytes)
	c.optimizer_bytes, c.activation_bytes = C.int32_t(p.OptimizerBytes), C.int32_t(p.ActivationBytes)
	c.distributed_optimizer, c.recompute, c.offload = C.int32_t(p.DistributedOptimizer), C.int32_t(p.Recompute), C.int32_t(p.Offload)
	c.device_memory_bytes = C.int64_t(p.DeviceMemoryBytes)
	return c
}

func planParallelFromC(c *C.moe_plan_parallel) PlanParallel {
	return PlanParallel{TP: int32(c.tp), CP: int32(c.cp), DP: int32(c.dp), PP: int32(c.pp), VPP: int32(c.vpp),
		EP: int32(c.ep), ETP: int32(c.etp), MicroBatch: int32(c.micro_batch), SeqLength: int64(c.seq_length),
		NumMicroBatches: int32(c.num_micro_batches), ParamBytes: int32(c.param_bytes), GradBytes: int32(c.grad_bytes),
		OptimizerBytes: int32(c.optimizer_bytes), ActivationBytes: int32(c.activation_bytes),
		DistributedOptimizer: int32(c.distributed_optimizer), Recompute: int32(c.recompute), Offload: int32(c.offload),
		DeviceMemoryBytes: int64(c.device_memory_bytes)}
}

// PlanPreset returns a published model and its training layout: "deepseek-v3", "qwen3-235b-a22b",
// "mixtral-8x7b" (moe_plan_model_preset).
func PlanPreset(name string) (PlanModel, PlanParallel, error) {
	var m C.moe_plan_model
	var p C.moe_plan_parallel
	C.moe_plan_model_init(&m, C.sizeof_moe_plan_model)
	C.moe_plan_parallel_init(&p, C.sizeof_moe_plan_parallel)
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	if err := callC(func() C.int32_t { return C.moe_plan_model_preset(cname, &m, &p) }); err != nil {
		return PlanModel{}, PlanParallel{}, err
	}
	return planModelFromC(&m), planParallelFromC(&p), nil
}

// PlanEstimate predicts per-GPU memory and per-step communication (moe_plan_estimate).
func PlanEstimate(model PlanModel, par PlanParallel) (PlanResult, error) {
	m, p := model.toC(), par.toC()
	var r C.moe_plan_result
	C.moe_plan_result_init(&r, C.sizeof_moe_plan_result)
	var out PlanResult
	if err := callC(func() C.int32_t { return C.moe_plan_estimate(&m, &p, &r) }); err != nil {
		return out, err
	}
	out.Stage, out.TotalBytes, out.DeviceMemoryBytes = int32(r.stage), int64(r.total_bytes), int64(r.device_memory_bytes)
	out.Fits, out.ParamsTotal, out.ParamsPerGPU = int32(r.fits), int64(r.params_total), int64(r.params_per_gpu)
	for i := range out.Bytes {
		out.Bytes[i] = int64(r.bytes[i])
	}
	for i := range out.CommBytes {
		out.CommBytes[i] = int64(r.comm_bytes[i])
	}
	return out, nil
}

// PlanLayerEstimate predicts the ledger's peaks (PeakBytes, TotalPeakBytes) of creating a layer with
// cfg on this context and running one training forward and backward of tokens tokens
// (moe_plan_layer_estimate).
func (c *Context) PlanLayerEstimate(cfg LayerConfig, tokens int64) (MemoryStats, error) {
	lc := cfg.toC()
	var s C.moe_memory_stats
	C.moe_memory_stats_init(&s, C.sizeof_moe_memory_stats)
	var out MemoryStats
	if err := c.call(func(p *C.moe_context) C.int32_t { return C.moe_plan_layer_estimate(p, &lc, C.int64_t(tokens), &s) }); err != nil {
		return out, err
	}
	for i := range out.PeakBytes {
		out.PeakBytes[i] = int64(s.peak_bytes[i])
	}
	out.TotalPeakBytes = int64(s.total_peak_bytes)
	return out, nil
}

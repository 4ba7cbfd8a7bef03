/*
 * libmoe — public C ABI, version 0.2.
 *
 * One header, no CUDA includes. Rules (docs/abi.md has the long form):
 *  - every fallible call returns int32_t status (MOE_OK = 0); the detailed message is read with
 *    moe_context_last_error() (or moe_last_error() for failures before a context exists);
 *  - config structs begin with {struct_size, api_version, next}; call the matching *_init() first;
 *    zero means "default" for every other field; structs only ever grow (append-only). The engine
 *    reads min(struct_size, its size) bytes: an older host's smaller struct is accepted (the fields it
 *    lacks are default), a newer host's larger one when the bytes beyond the engine's are zero; a size
 *    below the struct's first release or ending inside a field is MOE_ERR_VERSION (docs/abi.md);
 *  - output structs (stats, plan results, moe_layer_get_config) receive min(struct_size, engine size)
 *    bytes, and struct_size is set to the bytes written;
 *  - inputs are borrowed const DLTensor*, outputs are caller-provided DLTensor* or engine-exported
 *    DLManagedTensor* whose deleter the caller calls exactly once;
 *  - nothing the caller passed is modified when a call fails; the library never aborts, exits or prints;
 *  - a handle may move between threads but is never used by two threads at once.
 */
#ifndef MOE_H
#define MOE_H

#include <stddef.h>
#include <stdint.h>
#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MOE_API __declspec(dllimport)
#elif defined(MOE_BUILDING_LIBRARY)
#define MOE_API __attribute__((visibility("default")))
#else
#define MOE_API
#endif

/* ---------------------------------------------------------------- version */
#define MOE_VERSION_MAJOR 0
#define MOE_VERSION_MINOR 2
#define MOE_VERSION_PATCH 0
/* major*10000 + minor*100 + patch, like zstd's ZSTD_VERSION_NUMBER */
#define MOE_VERSION_NUMBER (MOE_VERSION_MAJOR * 10000 + MOE_VERSION_MINOR * 100 + MOE_VERSION_PATCH)
/* What config headers carry in api_version: the header the host compiled against. */
#define MOE_API_VERSION MOE_VERSION_NUMBER

MOE_API uint32_t moe_version_number(void);
MOE_API const char *moe_version_string(void);

/* Bits of moe_build_features(). */
#define MOE_FEATURE_CPU       (1ull << 0)
#define MOE_FEATURE_OPENMP    (1ull << 1)
#define MOE_FEATURE_OPENBLAS  (1ull << 2)
#define MOE_FEATURE_ONEDNN    (1ull << 3)
#define MOE_FEATURE_BF16      (1ull << 4)
#define MOE_FEATURE_FP64      (1ull << 5)
#define MOE_FEATURE_CUDA      (1ull << 8)
#define MOE_FEATURE_NCCL      (1ull << 9)
#define MOE_FEATURE_MPI       (1ull << 10)
#define MOE_FEATURE_FP8       (1ull << 11)
MOE_API uint64_t moe_build_features(void);

/* ---------------------------------------------------------------- status */
enum {
    MOE_OK = 0,
    MOE_ERR_INVALID_ARGUMENT = 1, /* a pointer, shape, dtype, stride, device or value is wrong */
    MOE_ERR_UNSUPPORTED = 2,      /* valid request this build or backend cannot do */
    MOE_ERR_OUT_OF_MEMORY = 3,
    MOE_ERR_VERSION = 4,          /* struct_size / api_version the engine cannot understand */
    MOE_ERR_STATE = 5,            /* call out of order (backward before forward, ...) */
    MOE_ERR_NONFINITE = 6,        /* NaN/Inf in an input under the rejecting policy */
    MOE_ERR_BACKEND = 7,          /* BLAS / CUDA / driver failure */
    MOE_ERR_COMM = 8,             /* a collective failed */
    MOE_ERR_TIMEOUT = 9,
    MOE_ERR_CALLBACK = 10,        /* a host hook reported failure */
    MOE_ERR_INTERNAL = 11,
    MOE_ERR_IO = 12               /* (0.2) a file could not be read or written, or is not what it claims */
};
MOE_API const char *moe_status_name(int32_t status);   /* "MOE_ERR_INVALID_ARGUMENT" */
MOE_API const char *moe_status_string(int32_t status); /* "invalid argument" */

/* ---------------------------------------------------------------- handles */
typedef struct moe_context moe_context;
typedef struct moe_layer moe_layer;
typedef struct moe_step moe_step;

/* Copies the last error message of ctx (NUL-terminated, truncated to cap) and returns the full
 * length it needs, snprintf style. ctx == NULL reads the calling thread's fallback message, which
 * records failures that happened before a context existed. buf may be NULL when cap is 0. */
MOE_API size_t moe_context_last_error(const moe_context *ctx, char *buf, size_t cap);
MOE_API size_t moe_last_error(char *buf, size_t cap);

/* ---------------------------------------------------------------- hooks */
/* Every hook table: struct_size first, user_data passed first to every callback, release(user_data)
 * called exactly once when the context that copied the table is destroyed. NULL entries fall back to
 * the engine's defaults (a create that fails calls no release: the host still owns user_data).
 * Callbacks run on the calling thread and must not unwind across the boundary. The one exception is a
 * merged step that runs two lanes (moe_layer_forward_backward): its forward half's callbacks run on a
 * thread of the layer, never at the same time as the caller's. */
typedef struct moe_allocator {
    uint32_t struct_size;
    uint32_t reserved;
    void *user_data;
    /* returns NULL on failure; alignment is a power of two >= 256 (256 since 0.2, on every device:
     * cuBLASLt's workspace needs it). A block not aligned to it is handed back to free at once and
     * the allocation fails with MOE_ERR_CALLBACK. */
    void *(*alloc)(void *user_data, size_t bytes, size_t alignment, int32_t device_type, int32_t device_id,
                   void *stream);
    void (*free)(void *user_data, void *ptr, size_t bytes, int32_t device_type, int32_t device_id, void *stream);
    void (*release)(void *user_data);
} moe_allocator;

enum { MOE_LOG_ERROR = 0, MOE_LOG_WARN = 1, MOE_LOG_INFO = 2, MOE_LOG_DEBUG = 3 };
typedef struct moe_logger {
    uint32_t struct_size;
    int32_t max_level; /* messages with level <= max_level are delivered; 0 = errors only */
    void *user_data;
    void (*log)(void *user_data, int32_t level, const char *message);
    void (*release)(void *user_data);
} moe_logger;

typedef struct moe_profiler {
    uint32_t struct_size;
    uint32_t reserved;
    void *user_data;
    void (*range_push)(void *user_data, const char *name); /* "moe.router", "moe.experts.fc1", ... */
    void (*range_pop)(void *user_data);
    void (*release)(void *user_data);
} moe_profiler;

/* ---------------------------------------------------------------- context */
enum { MOE_DEVICE_CPU = 1 /* = kDLCPU */, MOE_DEVICE_CUDA = 2 /* = kDLCUDA */ };

typedef struct moe_context_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;          /* extension chain; must be NULL in 0.1 */
    int32_t device_type;       /* 0 = MOE_DEVICE_CPU */
    int32_t device_id;
    int32_t num_threads;       /* CPU worker threads; 0 = number of online cores */
    int32_t reserved0;
    const moe_allocator *allocator; /* copied; NULL = built-in caching pool */
    const moe_logger *logger;       /* copied; NULL = no logging */
    const moe_profiler *profiler;   /* copied; NULL = no ranges */
} moe_context_config;

MOE_API int32_t moe_context_config_init(moe_context_config *cfg, size_t struct_size);
MOE_API int32_t moe_context_create(const moe_context_config *cfg, moe_context **out);
MOE_API void moe_context_destroy(moe_context *ctx); /* NULL is a no-op */
MOE_API int32_t moe_context_num_threads(const moe_context *ctx, int32_t *out);

/* Memory ledger: every engine allocation is charged to one category. */
enum {
    MOE_MEM_WEIGHTS = 0,
    MOE_MEM_GRADS = 1,
    MOE_MEM_ACTIVATIONS = 2, /* step tapes: what backward needs */
    MOE_MEM_WORKSPACE = 3,
    MOE_MEM_COMM = 4,
    MOE_MEM_HOST = 5,        /* (0.2) host memory the engine holds: pinned staging, host copies of routing
                              * metadata (row offsets, exchange counts) */
    MOE_MEM_OFFLOAD = 6,     /* (0.2) saved activations moved to host memory (moe_layer_config.offload) */
    MOE_MEM_NUM_CATEGORIES = 8 /* room to grow without changing the struct */
};
typedef struct moe_memory_stats {
    uint32_t struct_size;
    uint32_t reserved;
    int64_t current_bytes[MOE_MEM_NUM_CATEGORIES];
    int64_t peak_bytes[MOE_MEM_NUM_CATEGORIES];
    int64_t total_current_bytes;
    int64_t total_peak_bytes;
    int64_t num_allocations; /* live allocations */
    /* since 0.2 (struct_size covers them): the built-in caching pool */
    int64_t cached_bytes;       /* freed blocks the pool keeps for reuse (0 with a host allocator) */
    int64_t reserved_bytes;     /* total_current_bytes + cached_bytes: what the context holds */
    int64_t peak_reserved_bytes;
    int64_t device_allocations; /* raw device allocations made since creation (steady state: constant) */
    int64_t trims;              /* times the cache was emptied (moe_context_memory_trim, out-of-memory retries) */
} moe_memory_stats;
/* (0.2) Zeroes struct_size bytes of stats and sets stats->struct_size (bindings: sizeof their struct). */
MOE_API int32_t moe_memory_stats_init(moe_memory_stats *stats, size_t struct_size);
/* stats->struct_size must be set by the caller (0.1 hosts: 160); the engine fills n = min(struct_size,
 * its size) bytes and sets struct_size to n. */
MOE_API int32_t moe_context_memory_stats(const moe_context *ctx, moe_memory_stats *stats);
/* Gives every cached free block back to the device (waiting for the streams that may still use them,
 * then freeing in stream's order; stream: NULL = the context's stream). Live allocations are
 * untouched. An allocation that fails is retried after the same trim (and, if that fails, once more
 * after waiting for its stream) before MOE_ERR_OUT_OF_MEMORY is returned. */
MOE_API int32_t moe_context_memory_trim(moe_context *ctx, void *stream);
/* (0.2) What one step holds: its tape (MOE_MEM_ACTIVATIONS; the device buffers backward needs and the
 * step's scratch) and its host metadata (MOE_MEM_HOST), current and peak over the step's life;
 * num_allocations = its live buffers. The pool fields are 0. Sizes are the ledger's (rounded to the
 * pool's size classes), so a context's ACTIVATIONS bytes are the sum over its live steps. */
MOE_API int32_t moe_step_memory_stats(const moe_step *step, moe_memory_stats *stats);

/* ---------------------------------------------------------------- layer config */
enum { MOE_ACT_SWIGLU = 0, MOE_ACT_GEGLU = 1, MOE_ACT_GELU = 2, MOE_ACT_RELU = 3, MOE_ACT_SILU = 4 };
enum {
    MOE_SCORE_SOFTMAX = 0,            /* top-k, then softmax over the k selected logits (default) */
    MOE_SCORE_SOFTMAX_PRE_TOPK = 1,   /* softmax over all experts, then top-k, no renormalisation */
    MOE_SCORE_SIGMOID = 2,
    MOE_SCORE_SQRTSOFTPLUS = 3
};
enum { MOE_AUX_NONE = 0, MOE_AUX_SWITCH = 1, MOE_AUX_SEQUENCE = 2, MOE_AUX_GLOBAL = 3 };
enum { MOE_DROP_PROBS = 0, MOE_DROP_POSITION = 1 };
enum { MOE_DTYPE_FP32 = 0, MOE_DTYPE_BF16 = 1, MOE_DTYPE_FP64 = 2 /* CPU only: the reference precision */ };
/* What a layer does with NaN/Inf in its inputs (moe_layer_config.nonfinite_policy; docs/semantics.md
 * "NaN and Inf"). Under either policy the engine never checks gradients: a host that wants the "found
 * inf" check of loss scaling (AMP's GradScaler) calls moe_layer_check_gradients before its optimizer step. */
enum {
    /* default: moe_layer_forward (x) and moe_layer_backward / backward_data (dy) return MOE_ERR_NONFINITE,
     * before anything is written, when their input holds NaN/Inf. The message names the tensor, the token
     * (row) and column of the first non-finite element, whether it is NaN, +Inf or -Inf, and how many the
     * tensor holds ("x holds 3 non-finite values; the first is NaN at token 17, column 4 ..."). A clean
     * input costs one flag read; the tensor is copied to the host only to write that message. */
    MOE_NONFINITE_REJECT = 0,
    MOE_NONFINITE_PROPAGATE = 1 /* no check; NaN/Inf flow through as IEEE arithmetic makes them */
};

/* Float fields. Every `float` of a config struct (scaling_factor, bias_update_rate, aux_loss_coeff,
 * z_loss_coeff, capacity_factor here, moe_step_config.aux_loss_scale) is read one way: as the decimal
 * the host wrote, i.e. the shortest decimal (at most 9 significant digits) that rounds to that float,
 * taken as the nearest double (0.1f -> 0.1, 1.1f -> 1.1, not 1.10000002384...); the engine computes
 * with that double. Why: hosts write decimals (literals, config files, Python and Julia floats) and their
 * references compute in double from the same literal, so the layer matches them: the capacity
 * ceil(T*K/E * f) for T*K/E = 250 and f = 1.1f is 275 as math.ceil(250 * 1.1) gives, where the float's
 * exact value gives 276; loss values are alpha * L with the decimal alpha. Nothing is lost: the double
 * rounds back to the same float, and a short binary fraction (1.25f) reads as itself. `double` fields
 * (moe_dispatcher_config.capacity_factor) are used as given, so a dispatcher with 1.1 and a layer with
 * 1.1f have the same capacity. docs/math.md §1 and §4.1. */
typedef struct moe_layer_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;              /* must be NULL in 0.1 */
    int64_t hidden_size;           /* H (required) */
    int64_t ffn_hidden_size;       /* F, per expert (required) */
    int32_t num_experts;           /* E (required) */
    int32_t top_k;                 /* K (required), 1 <= K <= E */
    int32_t activation;            /* MOE_ACT_*; gated ones make FC1 2F x H (gate rows, then up rows) */
    int32_t score_function;        /* MOE_SCORE_* */
    int32_t num_groups;            /* G for group-limited routing; 0 = none */
    int32_t group_topk;            /* M groups kept; required when num_groups > 0 */
    float scaling_factor;          /* gamma applied to probabilities; 0 = 1.0 */
    int32_t expert_bias;           /* 1 = aux-loss-free expert bias (sigmoid / sqrtsoftplus only) */
    float bias_update_rate;        /* u; 0 = 1e-3 */
    int32_t aux_loss_type;         /* MOE_AUX_* */
    float aux_loss_coeff;          /* alpha */
    int64_t seq_length;            /* S for MOE_AUX_SEQUENCE; T must be a multiple of S */
    float z_loss_coeff;            /* beta; 0 = no z-loss */
    float capacity_factor;         /* 0 = dropless; (0, 1e6]: C = ceil(T*K/E * factor) */
    int32_t drop_policy;           /* MOE_DROP_* */
    int32_t pad_to_capacity;       /* 1 = every expert gets exactly C rows (static shapes) */
    int64_t shared_ffn_hidden_size;/* F_s; 0 = no shared expert */
    int32_t shared_gate;           /* 1 = shared output gated by sigmoid(x . w_g) per token */
    int32_t param_dtype;           /* MOE_DTYPE_*; router weight and expert bias are always fp32 (fp64 for FP64) */
    int32_t nonfinite_policy;      /* MOE_NONFINITE_* */
    int32_t reserved0;
    uint64_t seed;                 /* parameter initialisation seed (0 is a valid seed) */
    /* since 0.2 (struct_size covers it): MOE_GRAPHS_AUTO captures forward and backward as CUDA Graphs
     * and replays them where shapes are static (docs/cuda.md, "CUDA Graphs"); MOE_GRAPHS_OFF never */
    int32_t graphs;
    /* since 0.2: what backward recomputes instead of keeping from forward (MOE_LAYER_RECOMPUTE_* bits;
     * 0 = keep all). The activation output is always recomputed from the FC1 output (never kept).
     * Gradients are bitwise those of keeping everything; moe_step_memory_stats shows the saving. */
    int32_t recompute;
    /* since 0.2: saved activations moved to host memory after forward and back before backward
     * (MOE_LAYER_OFFLOAD_* bits; 0 = none); what is recomputed is not offloaded. Gradients are bitwise
     * those of keeping everything on the device; the ledger charges the host copies to MOE_MEM_OFFLOAD. */
    int32_t offload;
    /* since 0.2: the low-precision recipe of the expert GEMMs (MOE_QUANT_*; 0 = none: the GEMMs run in
     * param_dtype). Each operand of the six expert GEMMs (forward, data and weight gradient of FC1 and
     * FC2) is quantised per expert along its contraction dimension, as docs/memory.md "Low precision"
     * describes; the router and the shared expert stay in param_dtype. fp32 and bf16 layers only. A
     * recipe the backend cannot run is MOE_ERR_UNSUPPORTED at create. */
    int32_t quant_recipe;
    /* since 0.2: saved activations kept in FP8 (E4M3, 1x128 block scales) between forward and backward
     * (MOE_LAYER_FP8_STORE_* bits; 0 = none): a quarter of their fp32 bytes plus the scales; backward
     * uses the dequantised values, so gradients change within the error docs/memory.md measures. */
    int32_t fp8_storage;
    int32_t reserved3;
} moe_layer_config;
enum { MOE_GRAPHS_AUTO = 0, MOE_GRAPHS_OFF = 1 };
enum {
    MOE_LAYER_RECOMPUTE_EXPERT_FC1 = 1, /* the experts' FC1 output [R, F1], from the kept expert input rows */
    MOE_LAYER_RECOMPUTE_ROUTER = 2,     /* the router logits [T, E], from the layer input */
    MOE_LAYER_RECOMPUTE_EXPERT_MLP = 4  /* the whole expert MLP: FC1 output and the expert input rows, from
                                         * the layer input (one rank: EP = ETP = 1) */
};
enum {
    MOE_LAYER_OFFLOAD_EXPERT_FC1 = 1,   /* the experts' FC1 output [R, F1] */
    MOE_LAYER_OFFLOAD_EXPERT_INPUT = 2, /* the expert input rows [R, H] */
    MOE_LAYER_OFFLOAD_ROUTER = 4,       /* the router logits [T, E] */
    MOE_LAYER_OFFLOAD_INPUT = 8         /* the layer input [T, H] in the compute dtype */
};
enum {
    MOE_QUANT_NONE = 0,
    MOE_QUANT_FP8_TENSORWISE = 1, /* FP8, one current-amax scale per operand and expert: E4M3 for inputs
                                   * and weights, E5M2 for output gradients (the "hybrid" recipe) */
    MOE_QUANT_FP8_BLOCKWISE = 2,  /* FP8 E4M3, 1x128 block scales for activations and gradients, 128x128
                                   * tiles for weights (DeepSeek-V3) */
    MOE_QUANT_MXFP8 = 3,          /* FP8 E4M3 in blocks of 32 with E8M0 scales (OCP MX; Blackwell GEMMs) */
    MOE_QUANT_NVFP4 = 4           /* FP4 E2M1 in blocks of 16 with E4M3 scales and an fp32 tensor scale */
};
enum {
    MOE_LAYER_FP8_STORE_EXPERT_FC1 = 1,  /* the experts' FC1 output [R, F1] */
    MOE_LAYER_FP8_STORE_EXPERT_INPUT = 2 /* the expert input rows [R, H] */
};

MOE_API int32_t moe_layer_config_init(moe_layer_config *cfg, size_t struct_size);

/* Creates a layer with parameters initialised from cfg->seed (see moe_layer_init_params). */
MOE_API int32_t moe_layer_create(moe_context *ctx, const moe_layer_config *cfg, moe_layer **out);
/* Drops the host's reference; exported views keep the storage alive until their deleters run. */
MOE_API void moe_layer_destroy(moe_layer *layer);
/* Copies the layer's config with defaults resolved (scaling_factor 1, bias_update_rate 1e-3, ...).
 * out->struct_size is set by the caller (moe_layer_config_init); the engine writes n = min(struct_size,
 * its size) bytes, struct_size = n, api_version = the library's; bytes past n are not touched. */
MOE_API int32_t moe_layer_get_config(const moe_layer *layer, moe_layer_config *out);

/* ---------------------------------------------------------------- parameters
 * Slot            shape (row-major, contiguous)       dtype
 * ROUTER_WEIGHT   [E, H]                               fp32 (fp64 when param_dtype = FP64)
 * EXPERT_FC1      [E, F1, H], F1 = 2F gated else F     param_dtype (gated: rows 0..F-1 gate, F..2F-1 up)
 * EXPERT_FC2      [E, H, F]                            param_dtype
 * SHARED_FC1      [Fs1, H], Fs1 = 2Fs gated else Fs     param_dtype   (only with shared experts)
 * SHARED_FC2      [H, Fs]                              param_dtype
 * SHARED_GATE     [H]                                  param_dtype   (only with shared_gate)
 * EXPERT_BIAS     [E]                                  fp32/fp64     (only with expert_bias; no gradient)
 * Gradients have the same shapes; their dtype is fp32 for bf16 parameters ("main grads"), else the
 * parameter dtype. Parameter and gradient views are CPU tensors for the CPU device. */
enum {
    MOE_PARAM_ROUTER_WEIGHT = 0,
    MOE_PARAM_EXPERT_FC1 = 1,
    MOE_PARAM_EXPERT_FC2 = 2,
    MOE_PARAM_SHARED_FC1 = 3,
    MOE_PARAM_SHARED_FC2 = 4,
    MOE_PARAM_SHARED_GATE = 5,
    MOE_PARAM_EXPERT_BIAS = 6,
    MOE_PARAM_NUM_SLOTS = 7
};
/* Returns 1 if the layer has this slot, 0 if not (e.g. SHARED_FC1 without shared experts). */
MOE_API int32_t moe_layer_has_param(const moe_layer *layer, int32_t slot);
/* Exports a view of a parameter / gradient; writes through the view change the layer.
 * The caller calls (*out)->deleter(*out) exactly once; the view keeps the layer's storage alive. */
MOE_API int32_t moe_layer_param(moe_layer *layer, int32_t slot, DLManagedTensor **out);
MOE_API int32_t moe_layer_grad(moe_layer *layer, int32_t slot, DLManagedTensor **out);
/* Copies a host tensor into a parameter slot (same shape; same dtype, or fp32 into a bf16 slot with
 * round-to-nearest-even). Any strides are accepted. Runs after the layer's earlier calls on any stream and
 * before its later ones; src has been read when it returns (docs/cuda.md, "Streams and devices"). */
MOE_API int32_t moe_layer_import_param(moe_layer *layer, int32_t slot, const DLTensor *src);
/* Copies a parameter (grad = 0) or its gradient (grad = 1) into a caller tensor of the same shape and dtype.
 * Copies what the layer's earlier calls on any stream left; dst is written when it returns. */
MOE_API int32_t moe_layer_export_param(moe_layer *layer, int32_t slot, int32_t grad, DLTensor *dst);
/* Deterministic initialisation from a seed, independent of the thread count:
 * router and FC1 ~ U(-1/sqrt(H), 1/sqrt(H)), FC2 ~ U(-1/sqrt(F), 1/sqrt(F)), shared alike, bias 0. */
MOE_API int32_t moe_layer_init_params(moe_layer *layer, uint64_t seed);
/* Zeroes every gradient on the context's stream, after the layer's earlier calls on any stream and before
 * its later ones; returns without waiting. */
MOE_API int32_t moe_layer_zero_grad(moe_layer *layer);
enum { MOE_GRAD_ACCUMULATE = 0 /* default: backward adds into the gradients */, MOE_GRAD_OVERWRITE = 1 };
MOE_API int32_t moe_layer_set_grad_mode(moe_layer *layer, int32_t mode);

/* ---------------------------------------------------------------- non-finite gradients (0.2)
 * The "found inf" check a host runs on the gradients before its optimizer step, as AMP's GradScaler
 * does: when num_nonfinite > 0 it skips the step (and, with loss scaling, lowers the scale), or stops
 * and reports the expert. The engine never checks gradients itself (nonfinite_policy is about x and
 * dy): a NaN/Inf born inside the layer (an overflowing product, a NaN weight) reaches them under
 * every policy. */
enum {
    MOE_NONFINITE_KIND_NONE = 0, /* no non-finite value was found */
    MOE_NONFINITE_KIND_NAN = 1,
    MOE_NONFINITE_KIND_POS_INF = 2,
    MOE_NONFINITE_KIND_NEG_INF = 3
};
/* "First" is in scan order: slots in MOE_PARAM_* order, then experts, then elements, ascending. */
typedef struct moe_nonfinite_report {
    uint32_t struct_size;   /* set by the caller (moe_nonfinite_report_init); the engine fills
                             * n = min(struct_size, its size) bytes and sets struct_size = n */
    int32_t first_slot;     /* MOE_PARAM_* whose gradient holds the first non-finite value; -1 when none */
    int64_t num_nonfinite;  /* non-finite gradient values over every slot: 0 = the optimizer step may run */
    int64_t num_nan;        /* of which NaN (the others are +Inf or -Inf) */
    int32_t num_experts;    /* this rank's experts whose EXPERT_FC1 or EXPERT_FC2 gradient holds any */
    int32_t num_slots;      /* slots whose gradient holds any */
    int32_t first_expert;   /* global expert id of the first value (EXPERT_FC1 / FC2 slots); -1 for the router
                             * and shared-expert slots, and when none */
    int32_t first_kind;     /* MOE_NONFINITE_KIND_* of the first value */
    int64_t first_index;    /* its flat row-major index within that expert's block of the slot ([F1, H] of
                             * EXPERT_FC1, [H, F] of EXPERT_FC2; this rank's ETP shard), or within the whole
                             * slot when first_expert = -1; -1 when none */
} moe_nonfinite_report;
/* (0.2) Zeroes struct_size bytes of out and sets out->struct_size. */
MOE_API int32_t moe_nonfinite_report_init(moe_nonfinite_report *out, size_t struct_size);
/* (0.2) Scans every gradient slot of the layer (router weight, expert FC1 / FC2, the shared expert's;
 * EXPERT_BIAS has none) for NaN and Inf, after the work queued on stream (NULL = the context's stream),
 * and waits for the answer. Returns MOE_OK when the scan ran, whatever it found: the report says what
 * (all zero, first_* = -1 and MOE_NONFINITE_KIND_NONE for clean gradients). The gradients are not
 * changed. Cost: one finite check per expert block and one flag read; only a block holding a non-finite
 * value is copied to the host, to locate and count them. With expert parallelism each rank reports its
 * own experts; hosts reduce num_nonfinite over the ranks before deciding to skip. */
MOE_API int32_t moe_layer_check_gradients(const moe_layer *layer, moe_nonfinite_report *out, void *stream);

/* ---------------------------------------------------------------- steps */
enum {
    MOE_STEP_TRAIN = 0,     /* keeps the tape for backward; counts tokens for the expert bias */
    MOE_STEP_EVAL = 1,      /* no tape, no counting, no backward */
    MOE_STEP_RECOMPUTE = 2  /* keeps the tape but does not count again (host activation checkpointing) */
};
typedef struct moe_step_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t mode;           /* MOE_STEP_* */
    /* factor on the aux- and z-loss gradients (the host's main-loss scale, e.g. 1/num_microbatches);
     * 0 = 1.0, unless flags has MOE_STEP_EXPLICIT_AUX_SCALE. The reported loss values never include it. */
    float aux_loss_scale;
    /* since 0.2 (struct_size covers them): MOE_STEP_* flag bits below; 0 = none */
    int32_t flags;
    int32_t reserved0;
} moe_step_config;
/* Bits of moe_step_config.flags. */
enum {
    /* aux_loss_scale is used as given, 0 included: with 0 the step reports the aux and z-loss values
     * (moe_step_routing_stats) but adds nothing to any gradient, exactly as a layer without the losses */
    MOE_STEP_EXPLICIT_AUX_SCALE = 1
};

MOE_API int32_t moe_step_config_init(moe_step_config *cfg, size_t struct_size);
/* A step is the tape of one forward. Several steps of one layer may be in flight (micro-batches). */
MOE_API int32_t moe_step_create(moe_layer *layer, const moe_step_config *cfg, moe_step **out);
MOE_API void moe_step_destroy(moe_step *step);

/* x [T, H] and y [T, H] in the layer's param_dtype (fp32, bf16 or fp64), on the layer's device,
 * contiguous row-major (strides NULL or compact); any T >= 0. y is overwritten. stream: NULL = the
 * context's stream (ignored on CPU), else a stream of the context's device; whichever it names, the call
 * runs after the layer's earlier calls and before its later ones (docs/cuda.md, "Streams and devices").
 * Router arithmetic is fp32 whatever the dtype (fp64 for FP64). */
MOE_API int32_t moe_layer_forward(moe_layer *layer, moe_step *step, const DLTensor *x, DLTensor *y, void *stream);
/* Full backward: dx [T, H] is overwritten; parameter gradients are accumulated (or overwritten, per
 * the grad mode). Aux and z-loss gradients are added into the router's, times the step's aux-loss
 * scale (none at all when that scale is an explicit 0). */
MOE_API int32_t moe_layer_backward(moe_layer *layer, moe_step *step, const DLTensor *dy, DLTensor *dx, void *stream);
/* The two phases of backward, for pipeline schedules that delay weight gradients:
 * backward_data computes dx (and keeps what the weight phase needs); backward_weights adds the
 * parameter gradients. backward == backward_data then backward_weights. */
MOE_API int32_t moe_layer_backward_data(moe_layer *layer, moe_step *step, const DLTensor *dy, DLTensor *dx,
                                        void *stream);
MOE_API int32_t moe_layer_backward_weights(moe_layer *layer, moe_step *step, void *stream);
/* (since 0.2) Starts reloading the step's offloaded activations (moe_layer_config.offload) to the
 * device on the context's copy stream, after the work queued on stream so far (NULL = the context's
 * stream), so that backward_data does not wait for the copies: a host calls it for layer i-1 before
 * running the backward of layer i. Without it backward_data reloads them itself. A no-op when nothing
 * is offloaded or the reload was started already. MOE_ERR_INVALID_ARGUMENT for a NULL step;
 * MOE_ERR_STATE unless the step's last call was a successful forward of a step that keeps a tape. */
MOE_API int32_t moe_step_prefetch(moe_step *step, void *stream);

/* ---------------------------------------------------------------- merged forward/backward (0.2)
 * The steady state of a 1F1B pipeline runs, per layer, the forward of micro-batch i+1 and the
 * backward of micro-batch i back to back. moe_layer_forward_backward runs them as one call, in two
 * halves that take turns: whenever one half waits for an expert-parallel exchange it started
 * (dispatch, combine and their backwards), the other computes (router, permutation, expert GEMMs,
 * weight gradients), so each exchange is in flight behind the other half's compute. Weight gradients
 * the host deferred (weights_step) fill the gaps where both halves wait (docs/parallel.md, "Merged
 * forward and backward", with a whole 1F1B schedule in examples/pipeline_1f1b.c).
 *
 * Exact: y, dx, every gradient, the aux/z losses, routing statistics and expert-bias counts are
 * bitwise those of the separate calls moe_layer_backward_weights(weights_step), moe_layer_forward
 * (forward_step), moe_layer_backward_data + (unless deferred) moe_layer_backward_weights
 * (backward_step), with the same layout and thread count: each half runs its separate call's ops on
 * its own step, and gradients are accumulated in that order.
 *
 * Where the layer exchanges nothing (EP = ETP = 1), or one of forward_step / backward_step is NULL
 * (a pipeline's warm-up and cool-down), the parts simply run in that order on the calling thread.
 * Otherwise the forward half runs on a thread the layer keeps (its profiler ranges and log messages
 * come from that thread; the two halves never run engine code at the same time, so comms see one
 * caller at a time: MPI_THREAD_SERIALIZED suffices) and, on a CUDA context, on a second stream of the
 * layer, ordered after `stream`'s earlier work and joined back into `stream` before the call returns.
 * The halves issue their collectives in an order fixed by their programs (they hand over only at
 * their waits), the same on every rank.
 *
 * On failure the call returns the first error. Each part has then either completed (its step moved
 * on as its separate call moves it) or left its step, its outputs and the layer as they were; after
 * a failure on one half the other issues no further collective, so the peers fail too (time out)
 * rather than match the halves' exchanges out of order. */
typedef struct moe_merged_step {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    /* the forward of micro-batch i+1: as moe_layer_forward's step, x, y (step NULL: no forward) */
    moe_step *forward_step;
    const DLTensor *x;
    DLTensor *y;
    /* the backward of micro-batch i: as moe_layer_backward's step, dy, dx (step NULL: no backward) */
    moe_step *backward_step;
    const DLTensor *dy;
    DLTensor *dx;
    /* a step whose backward_data ran and whose weight gradients are still pending (an earlier merged
     * call with MOE_MERGED_DEFER_WEIGHT_GRADS, or moe_layer_backward_data): added in this call, in the
     * gaps (NULL: none). moe_layer_backward_weights adds them instead (a flush). */
    moe_step *weights_step;
    int32_t flags;     /* MOE_MERGED_* bits; 0 = none */
    int32_t reserved0;
} moe_merged_step;
enum {
    /* backward_step's weight gradients are not added: the step stays after backward_data, for a later
     * call's weights_step (or moe_layer_backward_weights) */
    MOE_MERGED_DEFER_WEIGHT_GRADS = 1
};
MOE_API int32_t moe_merged_step_init(moe_merged_step *args, size_t struct_size);
/* The three steps must be distinct steps of this layer; forward_step may not be EVAL... (any mode the
 * separate forward takes), backward_step must hold a training forward, weights_step a finished
 * backward_data. Every argument is checked before anything runs. */
MOE_API int32_t moe_layer_forward_backward(moe_layer *layer, const moe_merged_step *args, void *stream);

/* ---------------------------------------------------------------- routing statistics */
typedef struct moe_routing_stats {
    uint32_t struct_size;
    uint32_t reserved;
    int64_t num_tokens;        /* T */
    int64_t num_assignments;   /* T*K */
    int64_t dropped;           /* assignments dropped by capacity */
    int64_t padded_rows;       /* zero rows added by pad_to_capacity */
    int64_t capacity;          /* C per expert; -1 when dropless */
    double aux_loss;           /* value of alpha * L (0 without aux loss) */
    double z_loss;             /* value of beta * L_z */
    /* since 0.2: values of this step's quantised operands (quant_recipe) and FP8-stored activations
     * (fp8_storage) that were beyond the format's range and saturated, over its forward and backward
     * so far (0 without either; current-amax scaling saturates only non-finite values) */
    int64_t quant_saturated;
} moe_routing_stats;
/* (0.2) Zeroes struct_size bytes of stats and sets stats->struct_size, like the config *_init functions
 * (the struct has no api_version: the engine writes it, the host only says how large it is). */
MOE_API int32_t moe_routing_stats_init(moe_routing_stats *stats, size_t struct_size);
/* stats->struct_size is set by the caller (0.1 hosts: 64); the engine fills n = min(struct_size, its
 * size) bytes and sets struct_size = n. Reads the step's last forward, on whatever stream it ran. */
MOE_API int32_t moe_step_routing_stats(const moe_step *step, moe_routing_stats *stats);

enum {
    MOE_ROUTING_EXPERT_INDICES = 0, /* [T, K] int32, descending score, ties by lower index */
    MOE_ROUTING_PROBS = 1,          /* [T, K] fp32 (fp64 for FP64 layers), after scaling */
    MOE_ROUTING_TOKENS_PER_EXPERT = 2, /* [E] int64, routed assignments before capacity */
    MOE_ROUTING_KEPT_PER_EXPERT = 3,   /* [E] int64, after capacity dropping */
    MOE_ROUTING_DROPPED_MASK = 4       /* [T, K] uint8, 1 = dropped */
};
/* Exports a copy of one routing result of the last forward on this step (owned by the caller), in host
 * memory, complete when it returns, whatever stream that forward ran on. */
MOE_API int32_t moe_step_export_routing(const moe_step *step, int32_t what, DLManagedTensor **out);

/* ---------------------------------------------------------------- expert bias (aux-loss-free balancing) */
/* Copies the tokens each expert received (after dropping) in the training forwards since the last
 * update into out ([E] int64). Hosts sum these over the data-parallel group before the update. Counts
 * the layer's earlier calls on any stream; out is written when it returns. */
MOE_API int32_t moe_layer_expert_counts(const moe_layer *layer, DLTensor *out);
/* b_i += u * sign(mean(n) - n_i), n = counts ([E] int64, already summed) or the layer's own counts
 * when counts is NULL; then resets the layer's counts. Queued on the context's stream after the layer's
 * earlier calls on any stream (counts has been read when it returns). */
MOE_API int32_t moe_layer_update_expert_bias(moe_layer *layer, const DLTensor *counts);
/* MOE_AUX_GLOBAL: clears the counts accumulated over the micro-batches of a global batch. Call after
 * the optimizer step. Queued on the context's stream after the layer's earlier calls on any stream. */
MOE_API int32_t moe_layer_reset_global_aux(moe_layer *layer);

/* ================================================================ communicators (0.2)
 * A moe_comm is a group of ranks the engine runs collectives on. Kinds: self (one rank), MPI (wraps
 * a host MPI_Comm; CPU clusters and the multi-rank tests), NCCL (engine-owned, GPU) and host hooks
 * (a framework that already owns its collectives). What a call on a comm waits for, by kind:
 *  - self: one rank; nothing waits for a peer.
 *  - MPI and NCCL: creation, moe_comm_split and every collective (those a layer or dispatcher runs
 *    included) wait at most the comm's timeout_ms for their peers; a peer that never arrives makes the
 *    call return MOE_ERR_TIMEOUT, and the comm is then broken (every later call fails at once). One
 *    window remains on MPI: MPI_Comm_split has no non-blocking form, so moe_comm_split first passes a
 *    timed barrier, and a peer that dies between that barrier and the split blocks it.
 *  - hooks: timeout_ms is not enforced. The engine calls the host's hooks on the calling thread (in a
 *    two-lane merged step, the forward half's on the layer's thread, never two at once) and cannot
 *    interrupt them, so a call waits as long as a hook blocks: the hooks own their timeouts. A
 *    hook that returns non-zero fails the call with MOE_ERR_CALLBACK and breaks the comm. */
typedef struct moe_comm moe_comm;

enum { MOE_COMM_SELF = 0, MOE_COMM_MPI = 1, MOE_COMM_NCCL = 2, MOE_COMM_HOOKS = 3, MOE_COMM_MODELED = 4 };
/* dtypes of reductions (MOE_DTYPE_FP32 / MOE_DTYPE_FP64 above, plus:) */
enum { MOE_DTYPE_INT64 = 3 };

typedef struct moe_comm_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t timeout_ms; /* per call that waits for peers; 0 = 300000 (5 minutes); MPI and NCCL only */
    int32_t reserved0;
} moe_comm_config;
MOE_API int32_t moe_comm_config_init(moe_comm_config *cfg, size_t struct_size);

/* cfg may be NULL (defaults). */
MOE_API int32_t moe_comm_create_self(moe_context *ctx, const moe_comm_config *cfg, moe_comm **out);
/* mpi_comm points to the host's MPI_Comm (NULL = MPI_COMM_WORLD); MPI must be initialised (with
 * MPI_THREAD_SERIALIZED or better if several host threads use libmoe). The engine duplicates the
 * communicator, so the host may free its own. MOE_ERR_UNSUPPORTED when built without MPI. */
MOE_API int32_t moe_comm_create_mpi(moe_context *ctx, const moe_comm_config *cfg, const void *mpi_comm,
                                    moe_comm **out);
/* NCCL: rank 0 calls moe_comm_nccl_unique_id, the host sends the bytes to every rank, each calls
 * moe_comm_create_nccl. *len receives the id size (cap >= 128). MOE_ERR_UNSUPPORTED without NCCL. */
MOE_API int32_t moe_comm_nccl_unique_id(void *buf, size_t cap, size_t *len);
MOE_API int32_t moe_comm_create_nccl(moe_context *ctx, const moe_comm_config *cfg, const void *unique_id,
                                     size_t id_len, int32_t rank, int32_t size, moe_comm **out);

/* Host collectives. Byte counts/offsets are per peer rank; reductions are in-place sums of `count`
 * elements of dtype (MOE_DTYPE_FP32, FP64, INT64). Each returns 0 on success, non-zero on failure
 * (the engine then returns MOE_ERR_CALLBACK). Entries may not be NULL except barrier. */
typedef struct moe_comm_hooks {
    uint32_t struct_size;
    int32_t rank;
    int32_t size;
    int32_t reserved0;
    void *user_data;
    int32_t (*all_to_all_v)(void *user_data, const void *send, const int64_t *send_bytes, const int64_t *send_offsets,
                            void *recv, const int64_t *recv_bytes, const int64_t *recv_offsets);
    int32_t (*all_gather_v)(void *user_data, const void *send, int64_t send_bytes, void *recv, const int64_t *recv_bytes,
                            const int64_t *recv_offsets);
    int32_t (*all_reduce)(void *user_data, void *buf, int64_t count, int32_t dtype);
    int32_t (*broadcast)(void *user_data, void *buf, int64_t bytes, int32_t root);
    int32_t (*barrier)(void *user_data);
    void (*release)(void *user_data);
} moe_comm_hooks;
MOE_API int32_t moe_comm_create_hooks(moe_context *ctx, const moe_comm_config *cfg, const moe_comm_hooks *hooks,
                                      moe_comm **out);

/* (0.2) A comm that models an interconnect on top of `inner` (host comms: self, MPI, hooks): every
 * exchange moves its bytes through inner at once, but completes only latency_us + bytes /
 * (bandwidth_gb_per_s * 1e9) after it started, its bytes queued behind the transfers still on the
 * link (one link per rank, first come first served; exchanges under 64 KiB, latency-bound, do not
 * queue). A waiting caller sleeps instead of spinning. For measuring how much of a step's
 * communication a schedule hides (bench/bench_merged) on a machine whose ranks talk through shared
 * memory in microseconds. bytes = the larger of what this rank sends and receives. inner is retained;
 * moe_comm_split of the result models a link of its own over inner's split. MOE_ERR_UNSUPPORTED for a
 * device comm (NCCL). */
MOE_API int32_t moe_comm_create_modeled(moe_comm *inner, double latency_us, double bandwidth_gb_per_s, moe_comm **out);
/* Collective over comm: ranks with the same color form a new comm, ordered by (key, old rank).
 * color < 0: this rank joins no group and *out is set to NULL. Not available for hook comms. */
MOE_API int32_t moe_comm_split(moe_comm *comm, int32_t color, int32_t key, moe_comm **out);
MOE_API int32_t moe_comm_rank(const moe_comm *comm, int32_t *out);
MOE_API int32_t moe_comm_size(const moe_comm *comm, int32_t *out);
MOE_API int32_t moe_comm_kind(const moe_comm *comm, int32_t *out);
MOE_API void moe_comm_destroy(moe_comm *comm);

/* ================================================================ Parallel Folding layouts (0.2)
 * The attention part of a model uses TP x CP x DP x PP ranks, the MoE part ETP x EP x EDP x PP over the
 * same world (docs/math.md §8). A layout maps every rank to its groups under a rank order (the first
 * dimension varies fastest). */
typedef struct moe_layout moe_layout;
typedef struct moe_layout_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t world_size;
    int32_t tp, cp, dp, pp;  /* attention sizes; 0 = 1, except dp: 0 = derived from the world */
    int32_t etp, ep;         /* MoE sizes; 0 = 1. EDP = world / (ETP * EP * PP) */
    const char *order;       /* NULL = "tp-cp-ep-dp-pp" */
} moe_layout_config;
MOE_API int32_t moe_layout_config_init(moe_layout_config *cfg, size_t struct_size);
MOE_API int32_t moe_layout_create(const moe_layout_config *cfg, moe_layout **out);
MOE_API void moe_layout_destroy(moe_layout *layout);

enum {
    MOE_GROUP_TP = 0, MOE_GROUP_CP = 1, MOE_GROUP_DP = 2, MOE_GROUP_PP = 3,
    MOE_GROUP_ETP = 4, MOE_GROUP_EP = 5, MOE_GROUP_EDP = 6,
    MOE_GROUP_DP_CP = 7,    /* router / shared-expert gradient reduction */
    MOE_GROUP_TP_CP = 8,    /* ranks sharing the same tokens: aux-loss counts */
    MOE_GROUP_TP_CP_DP = 9, /* expert-bias counts */
    MOE_GROUP_NUM = 10
};
/* Sizes of each dimension after defaults are resolved (tp, cp, dp, pp, etp, ep, edp). */
MOE_API int32_t moe_layout_sizes(const moe_layout *layout, int32_t *tp, int32_t *cp, int32_t *dp, int32_t *pp,
                                 int32_t *etp, int32_t *ep, int32_t *edp);
/* Members of `rank`'s group (ascending rank order) into members[0..cap); *count = group size,
 * *index = rank's position in it. members may be NULL to query the size. */
MOE_API int32_t moe_layout_group(const moe_layout *layout, int32_t rank, int32_t group, int32_t *members,
                                 int32_t cap, int32_t *count, int32_t *index);
/* Collective over a world comm of layout->world_size ranks: the comm of this rank's `group`. */
MOE_API int32_t moe_comm_split_layout(moe_comm *world, const moe_layout *layout, int32_t group, moe_comm **out);

/* ================================================================ expert parallelism (0.2)
 * A layer spread over ranks (docs/math.md §8): expert parallelism (EP: E/EP experts per rank), expert tensor
 * parallelism (ETP: F/ETP of every local expert per rank), and the reduction groups of the losses,
 * gradients and bias counts. All ranks of a group create their layers with the same config and seed;
 * expert weights are then the matching slices of the single-rank layer's. */
enum { MOE_DISPATCHER_ALL_TO_ALL = 0, MOE_DISPATCHER_ALL_GATHER = 1 };
typedef struct moe_parallel_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    moe_comm *ep_comm;   /* EP group; NULL = EP 1 */
    moe_comm *etp_comm;  /* ETP group; NULL = ETP 1 */
    moe_comm *aux_comm;  /* ranks whose tokens form one aux-loss problem (TP x CP); NULL = this rank */
    moe_comm *edp_comm;  /* expert-gradient reduction in moe_layer_reduce_grads; NULL = none */
    moe_comm *dp_comm;   /* router / shared-expert gradient reduction (DP x CP); NULL = none */
    moe_comm *bias_comm; /* expert-bias counts summed before the update (TP x CP x DP); NULL = this rank */
    int32_t dispatcher;  /* MOE_DISPATCHER_* */
    int32_t num_chunks;  /* all-to-all dispatcher: split each step's rows into this many chunks, each a
                          * group of local experts, and overlap the exchange of chunk i+1 with the
                          * expert compute of chunk i (0 or 1 = unchunked; at most one chunk per local
                          * expert: larger values are clamped to E_local; one rank, EP = ETP = 1, does
                          * not chunk). Results are bitwise those of the unchunked path. */
} moe_parallel_config;
MOE_API int32_t moe_parallel_config_init(moe_parallel_config *cfg, size_t struct_size);
/* The comms are retained by the layer (the host may destroy its handles after this call). */
MOE_API int32_t moe_layer_create_parallel(moe_context *ctx, const moe_layer_config *cfg,
                                          const moe_parallel_config *par, moe_layer **out);
/* All-reduces (sums) the gradients over their groups: expert weights over edp_comm, router and shared
 * expert over dp_comm (each skipped when NULL). Call once after the backward of the last micro-batch. */
MOE_API int32_t moe_layer_reduce_grads(moe_layer *layer, void *stream);

/* ================================================================ checkpoints (0.2)
 * A layer's whole training state as named tensors (its state dictionary), saved to safetensors files, one
 * per rank, and loaded onto any EP x ETP layout of the same layer: every rank reads the slices of its own
 * layout from whichever files hold them (docs/checkpoints.md: names, files, guarantees). */
enum {
    MOE_STATE_PARAM = 0,       /* a parameter slot (EXPERT_BIAS included) */
    MOE_STATE_GRAD = 1,        /* a parameter's gradient; listed and saved with MOE_CHECKPOINT_GRADS */
    MOE_STATE_ACCUMULATOR = 2, /* a per-rank running sum the next step reads: the expert-bias token counts,
                                * the MOE_AUX_GLOBAL state; saved per rank, loaded rank by rank (same rank
                                * count) or reset (MOE_CHECKPOINT_RESET_ACCUMULATORS) */
    MOE_STATE_COMPANION = 3    /* a host tensor attached to a slot (moe_layer_attach_state): optimizer
                                * moments, master weights; sliced like its slot */
};
/* One entry. The slice is a box in `view`, a row-major view of the global tensor with the same bytes:
 * the global shape itself, except the gated EXPERT_FC1 (and its gradient and companions), viewed as
 * [E, 2, F, H] (gate rows, up rows) so that an ETP shard is one box. A rank holding the whole tensor
 * has offset 0 and length = view_shape. */
typedef struct moe_state_entry {
    uint32_t struct_size;  /* set by the caller (moe_state_entry_init); the engine fills
                            * n = min(struct_size, its size) bytes and sets struct_size = n */
    int32_t kind;          /* MOE_STATE_* */
    int32_t slot;          /* the MOE_PARAM_* slot it is or follows; -1 for accumulators */
    int32_t dtype;         /* MOE_DTYPE_* as the layer (or the host, for companions) stores it */
    int32_t ndim;          /* of shape */
    int32_t view_ndim;     /* of view_shape, offset, length */
    int64_t shape[4];      /* global shape: the single-rank layer's (accumulators: this rank's own) */
    int64_t view_shape[4];
    int64_t offset[4];     /* this rank's box in the view */
    int64_t length[4];
    char name[96];         /* stable: "experts.fc1.weight", "experts.fc1.weight.grad", ... (NUL-terminated) */
} moe_state_entry;
/* Zeroes struct_size bytes of out and sets out->struct_size. */
MOE_API int32_t moe_state_entry_init(moe_state_entry *out, size_t struct_size);

enum {
    MOE_CHECKPOINT_GRADS = 1,   /* list, save and load the gradients too (mid-accumulation checkpoints) */
    MOE_CHECKPOINT_CAST = 2,    /* load: allow a dtype change that is not exact (fp32 -> bf16 rounds to
                                 * nearest even); without it only exact widenings load (bf16 -> fp32 -> fp64) */
    MOE_CHECKPOINT_RESET_ACCUMULATORS = 4 /* load: zero the accumulators instead of requiring the saved
                                 * rank count (they are per-rank sums and cannot be resharded) */
};
/* The entries of the layer's state, in a fixed order (parameters in MOE_PARAM_* order, then gradients,
 * accumulators, companions); flags: MOE_CHECKPOINT_GRADS or 0. */
MOE_API int32_t moe_layer_state_count(const moe_layer *layer, int32_t flags, int32_t *count);
MOE_API int32_t moe_layer_state_entry(const moe_layer *layer, int32_t flags, int32_t index, moe_state_entry *out);
/* Attaches a host tensor to a parameter slot under the host's name (1-63 characters of [A-Za-z0-9_.-],
 * unique in the layer; entry name "<slot's name>.<name>"): it must have the slot's local shape (this
 * rank's slice, as moe_layer_param shows it), be contiguous, and live in host memory (kDLCPU) or the
 * layer's device memory; any dtype the engine stores (fp32, bf16, fp64). Save reads it and load writes it,
 * sliced and resharded like the slot. The layer keeps only the pointer: the memory must stay valid until
 * moe_layer_detach_state or the layer's destruction. */
MOE_API int32_t moe_layer_attach_state(moe_layer *layer, int32_t slot, const char *name, const DLTensor *tensor);
MOE_API int32_t moe_layer_detach_state(moe_layer *layer, int32_t slot, const char *name);

typedef struct moe_checkpoint_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    const char *dir;  /* the checkpoint's directory; save creates it (one level) when missing */
    const char *name; /* the file stem in dir, so that several layers can share one directory; NULL =
                       * "moe"; 1-63 characters of [A-Za-z0-9_.-] */
    moe_comm *comm;   /* every rank that saves (loads) this layer's state calls with a comm of all of them:
                       * the rank count of the files, the agreement on success; NULL = this rank alone */
    int32_t flags;    /* MOE_CHECKPOINT_* */
    int32_t reserved0;
} moe_checkpoint_config;
MOE_API int32_t moe_checkpoint_config_init(moe_checkpoint_config *cfg, size_t struct_size);
/* Writes this rank's state to "<dir>/<name>-<generation>-rank<r>-of<n>.safetensors", then (rank 0,
 * once every rank's file is complete on disk) commits them by renaming "<dir>/<name>.index.json" into
 * place, then removes the files of the generation it replaced. Each file is written under a temporary
 * name, flushed and renamed: a crash at any point leaves the old checkpoint or the new one. Copies
 * what the layer's earlier calls on any stream left; the layer is held only while its state is copied
 * off the device. An error on any rank is returned on every rank and leaves the old checkpoint. */
MOE_API int32_t moe_layer_save(moe_layer *layer, const moe_checkpoint_config *cfg);
/* Loads the checkpoint committed in "<dir>/<name>.index.json" into the layer, whatever EP x ETP layout
 * and rank count saved it: each rank reads only the files holding its slices. Everything is read and
 * checked first (index, headers, per-tensor CRC-32, coverage of every slice, the layer config, dtypes);
 * any failure, on any rank, is returned on every rank and leaves every layer exactly as it was:
 * MOE_ERR_IO for a missing, truncated or corrupted file (the message names the file and tensor),
 * MOE_ERR_INVALID_ARGUMENT for a checkpoint of another layer config or a dtype change not allowed. */
MOE_API int32_t moe_layer_load(moe_layer *layer, const moe_checkpoint_config *cfg);

/* ================================================================ standalone token dispatcher (0.2)
 * For hosts with their own experts: moves the tokens of a routing decision the host made (expert
 * indices and probabilities) to the ranks owning those experts and back, with the layer's semantics
 * (docs/math.md §4, §5, §8: capacity and drops per rank, rows grouped by local expert, then source rank,
 * then token). Shapes: T local tokens, H hidden, K top-k, Rx rows received by this rank's E_local
 * experts (known after dispatch). One dispatch handle per routing decision, used in this order:
 *
 *   moe_dispatcher_dispatch   x [T,H], indices [T,K], probs [T,K]  -> handle (collective)
 *   moe_dispatch_info / moe_dispatch_rows                           -> x_rows [Rx,H], row_probs [Rx],
 *                                                                      tokens_per_expert [E_local]
 *   (host experts: y_rows [Rx,H] = f_e(x_rows))
 *   moe_dispatch_combine      y_rows [Rx,H] -> y [T,H]              (collective)
 *       y[t] = sum over t's kept assignments k of w_tk * y_rows[row(t,k)],
 *       w = probs (MOE_COMBINE_WEIGHTED) or 1 (MOE_COMBINE_UNWEIGHTED: the host applied them)
 *   moe_dispatch_combine_backward  dy [T,H] -> dy_rows [Rx,H], d_row_probs [Rx]   (collective)
 *       dy_rows = w * dy[t]; d_row_probs = <dy[t], y_rows[row]> (weighted; 0 when unweighted)
 *   moe_dispatch_backward     dx_rows [Rx,H], d_row_probs [Rx] -> dx [T,H], dprobs [T,K] (collective)
 *       dx[t] = sum of t's kept rows; dprobs[t,k] = d_row_probs of (t,k)'s row, 0 if dropped
 *
 * Every collective call must be made by all ranks of ep_comm in the same order. Padding rows
 * (pad_to_capacity) have row_probs 0, are zero in x_rows and are ignored by combine and backward. */
typedef struct moe_dispatcher moe_dispatcher;
typedef struct moe_dispatch moe_dispatch;
enum { MOE_COMBINE_WEIGHTED = 0, MOE_COMBINE_UNWEIGHTED = 1 };
typedef struct moe_dispatcher_config {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t kind;           /* MOE_DISPATCHER_* (default ALL_TO_ALL) */
    int32_t dtype;          /* of x, rows, probs and gradients: MOE_DTYPE_FP32 (default), BF16, FP64 */
    int64_t hidden;         /* H > 0 (required) */
    int32_t num_experts;    /* E global experts (required), a multiple of the EP size */
    int32_t top_k;          /* K in [1, E] (required) */
    double capacity_factor; /* 0 = dropless; else capacity ceil(T K / E * factor) per expert per rank */
    int32_t drop_policy;    /* MOE_DROP_* */
    int32_t pad_to_capacity;
    int32_t combine;        /* MOE_COMBINE_* (default WEIGHTED) */
    int32_t reserved0;
} moe_dispatcher_config;
MOE_API int32_t moe_dispatcher_config_init(moe_dispatcher_config *cfg, size_t struct_size);
/* ep_comm: the expert-parallel group (retained; NULL = one rank, no communication). */
MOE_API int32_t moe_dispatcher_create(moe_context *ctx, const moe_dispatcher_config *cfg, moe_comm *ep_comm,
                                      moe_dispatcher **out);
/* This rank's experts: global ids [*first_expert, *first_expert + *num_local_experts). */
MOE_API int32_t moe_dispatcher_local_experts(const moe_dispatcher *d, int32_t *num_local_experts,
                                             int32_t *first_expert);
/* Releases the host's reference; open dispatch handles keep the dispatcher alive. NULL is a no-op. */
MOE_API void moe_dispatcher_destroy(moe_dispatcher *d);

/* Collective. x [T,H] (dtype); indices [T,K] int32 or int64 (DLPack kDLInt), distinct global expert ids
 * per token in [0, E); probs [T,K] (dtype) or NULL = all 1. T may be 0. The inputs are copied. */
MOE_API int32_t moe_dispatcher_dispatch(moe_dispatcher *d, const DLTensor *x, const DLTensor *indices,
                                        const DLTensor *probs, moe_dispatch **out, void *stream);
/* Rows received by this rank's experts (Rx, padding rows included), and this rank's local counts:
 * assignments dropped by capacity and padding rows added (any pointer may be NULL). */
MOE_API int32_t moe_dispatch_info(const moe_dispatch *h, int64_t *num_rows, int64_t *dropped, int64_t *padded);
/* Copies the received rows out: x_rows [Rx,H] (dtype), row_probs [Rx] (dtype), tokens_per_expert
 * [E_local] int64 (rows per local expert, summing to Rx). Each may be NULL. Runs after the dispatcher's
 * earlier calls (the dispatch), whatever streams they named; the tensors are written when it returns. */
MOE_API int32_t moe_dispatch_rows(const moe_dispatch *h, DLTensor *x_rows, DLTensor *row_probs,
                                  DLTensor *tokens_per_expert);
MOE_API int32_t moe_dispatch_combine(moe_dispatch *h, const DLTensor *y_rows, DLTensor *y, void *stream);
/* After moe_dispatch_combine. d_row_probs may be NULL. */
MOE_API int32_t moe_dispatch_combine_backward(moe_dispatch *h, const DLTensor *dy, DLTensor *dy_rows,
                                              DLTensor *d_row_probs, void *stream);
/* d_row_probs may be NULL (= 0); dprobs may be NULL. */
MOE_API int32_t moe_dispatch_backward(moe_dispatch *h, const DLTensor *dx_rows, const DLTensor *d_row_probs,
                                      DLTensor *dx, DLTensor *dprobs, void *stream);
/* NULL is a no-op. */
MOE_API void moe_dispatch_destroy(moe_dispatch *h);

/* ================================================================ memory planner (0.2)
 * Predicts, from formulas and without allocating anything, what training a model under a parallel
 * layout needs per GPU (by category) and how many bytes each GPU sends per step in every parallel
 * group, and whether that fits a device. docs/planner.md gives every formula and its source, and
 * compares the presets with published figures. The MoE layer of this engine on one rank is predicted
 * exactly from what its step tape allocates (moe_plan_layer_estimate). */
enum { MOE_PLAN_ATTN_GQA = 0 /* MHA / GQA: num_heads, num_kv_heads, head_dim */, MOE_PLAN_ATTN_MLA = 1 };
typedef struct moe_plan_model {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t num_layers;             /* transformer layers (required) */
    int32_t first_dense_layers;     /* leading layers with a dense MLP */
    int32_t moe_layer_freq;         /* after those, every n-th layer is MoE (the others dense); 0 = 1 */
    int32_t num_experts;            /* E routed experts; 0 = a dense model */
    int32_t top_k;                  /* K (required with experts) */
    int32_t num_shared_experts;     /* shared experts per MoE layer */
    int64_t hidden_size;            /* H (required) */
    int64_t ffn_hidden_size;        /* dense MLP F (required when a layer is dense) */
    int64_t moe_ffn_hidden_size;    /* per routed expert (required with experts) */
    int64_t shared_ffn_hidden_size; /* per shared expert; 0 = moe_ffn_hidden_size */
    int64_t vocab_size;             /* V (required) */
    int32_t activation;             /* MOE_ACT_*: gated ones (SwiGLU, GeGLU) make FC1 2F x H */
    int32_t tied_embeddings;        /* 1 = output layer shares the embedding */
    int32_t attention;              /* MOE_PLAN_ATTN_* */
    int32_t num_heads;              /* required */
    int32_t num_kv_heads;           /* GQA; 0 = num_heads */
    int32_t head_dim;               /* GQA head size, MLA q/k "nope" size; 0 = H / num_heads */
    int32_t q_lora_rank;            /* MLA query compression; 0 = none */
    int32_t kv_lora_rank;           /* MLA (required with MLA) */
    int32_t qk_rope_head_dim;       /* MLA decoupled RoPE size */
    int32_t v_head_dim;             /* MLA value head size; 0 = head_dim */
} moe_plan_model;

enum { MOE_RECOMPUTE_NONE = 0, MOE_RECOMPUTE_SELECTIVE = 1 /* norms and activation functions */,
       MOE_RECOMPUTE_FULL = 2 /* every layer from its input */ };
enum { MOE_OFFLOAD_OPTIMIZER = 1 /* master weights and Adam states on the host */,
       MOE_OFFLOAD_ACTIVATIONS = 2 /* activations of waiting micro-batches on the host */ };
typedef struct moe_plan_parallel {
    uint32_t struct_size;
    uint32_t api_version;
    const void *next;
    int32_t tp, cp, dp, pp;         /* attention layout (docs/math.md §8); 0 = 1 */
    int32_t vpp;                    /* virtual pipeline stages per rank (interleaved 1F1B); 0 = 1 */
    int32_t ep, etp;                /* MoE layout; 0 = 1. EDP = tp cp dp / (ep etp) */
    int32_t micro_batch;            /* sequences per micro-batch; 0 = 1 */
    int64_t seq_length;             /* tokens per sequence (required) */
    int32_t num_micro_batches;      /* per step and data-parallel rank; 0 = pp */
    int32_t param_bytes;            /* bytes per weight; 0 = 2 (bf16) */
    int32_t grad_bytes;             /* bytes per gradient; 0 = 4 (fp32 main grads) */
    int32_t optimizer_bytes;        /* bytes per parameter of optimizer state; 0 = 12 (fp32 master + Adam m, v) */
    int32_t activation_bytes;       /* bytes per activation element; 0 = 2 (bf16) */
    int32_t distributed_optimizer;  /* 1 = optimizer state sharded over DP x CP (experts: EDP) */
    int32_t recompute;              /* MOE_RECOMPUTE_* */
    int32_t offload;                /* MOE_OFFLOAD_* bits */
    int64_t device_memory_bytes;    /* the device to check against; 0 = no check */
} moe_plan_parallel;

/* Categories of moe_plan_result.bytes, and groups of comm_bytes. */
enum {
    MOE_PLAN_WEIGHTS = 0, MOE_PLAN_GRADS = 1, MOE_PLAN_OPTIMIZER = 2, MOE_PLAN_ACTIVATIONS = 3,
    MOE_PLAN_COMM_BUFFERS = 4, MOE_PLAN_WORKSPACE = 5, MOE_PLAN_NUM_CATEGORIES = 8
};
enum {
    MOE_PLAN_COMM_EP = 0,  /* token all-to-all (dispatch and combine, forward and backward) */
    MOE_PLAN_COMM_TP = 1,  /* sequence-parallel all-gathers and reduce-scatters */
    MOE_PLAN_COMM_CP = 2,  /* key/value exchange of context parallelism */
    MOE_PLAN_COMM_DP = 3,  /* gradient reduction (and parameter all-gather) of dense weights over DP x CP */
    MOE_PLAN_COMM_EDP = 4, /* the same for expert weights over EDP */
    MOE_PLAN_COMM_PP = 5,  /* pipeline send/receive of activations and their gradients */
    MOE_PLAN_COMM_NUM = 8
};
typedef struct moe_plan_result {
    uint32_t struct_size;           /* set by the caller; the engine fills n = min(struct_size, its size) bytes
                                     * and sets struct_size = n */
    int32_t stage;                  /* pipeline stage the figures are for: the one needing the most memory */
    int64_t bytes[MOE_PLAN_NUM_CATEGORIES]; /* per GPU of that stage, at the step's peak */
    int64_t total_bytes;
    int64_t device_memory_bytes;    /* as given */
    int32_t fits;                   /* 1 = total_bytes <= device_memory_bytes, 0 = not, -1 = not checked */
    int32_t reserved;
    int64_t comm_bytes[MOE_PLAN_COMM_NUM]; /* bytes one GPU of that stage sends per step, per group */
    int64_t params_total;           /* parameters of the whole model */
    int64_t params_per_gpu;         /* parameters held by one GPU of that stage */
} moe_plan_result;

MOE_API int32_t moe_plan_model_init(moe_plan_model *model, size_t struct_size);
MOE_API int32_t moe_plan_parallel_init(moe_plan_parallel *par, size_t struct_size);
/* Fills model and par (both from their *_init first) with a published model and its published
 * training layout: "deepseek-v3", "qwen3-235b-a22b", "mixtral-8x7b" (docs/planner.md). par may be NULL. */
MOE_API int32_t moe_plan_model_preset(const char *name, moe_plan_model *model, moe_plan_parallel *par);
/* Zeroes struct_size bytes of out and sets out->struct_size. */
MOE_API int32_t moe_plan_result_init(moe_plan_result *out, size_t struct_size);
MOE_API int32_t moe_plan_estimate(const moe_plan_model *model, const moe_plan_parallel *par, moe_plan_result *out);
/* One MoE layer of this engine on one rank: the ledger's peaks (moe_context_memory_stats) of creating
 * a layer with cfg on ctx and running one training forward and backward of `tokens` tokens, predicted
 * from what the step tape allocates (rounded like the allocator). out->struct_size is set by the
 * caller; peak_bytes and total_peak_bytes are filled, every other field is 0. Where the rows each
 * expert receives decide a size (dropless routing, capacity without padding), the prediction takes
 * every routed row as kept and the mean padding of the single-rank dispatcher's row alignment. */
MOE_API int32_t moe_plan_layer_estimate(moe_context *ctx, const moe_layer_config *cfg, int64_t tokens,
                                        moe_memory_stats *out);

/* ================================================================ introspection (0.2)
 * What a host that cannot read this header's macros and enums (a binding, a reader of config files or
 * logs) asks the library at run time: the size of every struct with struct_size, and the name of every
 * constant. The ids below only grow; an id this library does not know (a newer host's) is answered
 * with MOE_ERR_INVALID_ARGUMENT or NULL, never guessed. */

/* The structs with struct_size. */
enum {
    MOE_STRUCT_CONTEXT_CONFIG = 0,
    MOE_STRUCT_ALLOCATOR = 1,
    MOE_STRUCT_LOGGER = 2,
    MOE_STRUCT_PROFILER = 3,
    MOE_STRUCT_MEMORY_STATS = 4,
    MOE_STRUCT_LAYER_CONFIG = 5,
    MOE_STRUCT_STEP_CONFIG = 6,
    MOE_STRUCT_ROUTING_STATS = 7,
    MOE_STRUCT_COMM_CONFIG = 8,
    MOE_STRUCT_COMM_HOOKS = 9,
    MOE_STRUCT_LAYOUT_CONFIG = 10,
    MOE_STRUCT_PARALLEL_CONFIG = 11,
    MOE_STRUCT_DISPATCHER_CONFIG = 12,
    MOE_STRUCT_PLAN_MODEL = 13,
    MOE_STRUCT_PLAN_PARALLEL = 14,
    MOE_STRUCT_PLAN_RESULT = 15,
    MOE_STRUCT_NONFINITE_REPORT = 16,
    MOE_STRUCT_STATE_ENTRY = 17,
    MOE_STRUCT_CHECKPOINT_CONFIG = 18,
    MOE_STRUCT_MERGED_STEP = 19
};
/* *size = the struct's size in this library (its sizeof); *min_size = its size in its first release, the
 * smallest struct_size the library accepts (docs/abi.md lists both). Either pointer may be NULL. A host
 * compares *size with the size it was built with: smaller means an older library (the host's extra
 * fields must then stay zero), larger a newer one. kind unknown: MOE_ERR_INVALID_ARGUMENT. */
MOE_API int32_t moe_struct_size(int32_t kind, size_t *size, size_t *min_size);

/* Families of constants, for moe_enum_name / moe_enum_value. Families marked "bits" are bit sets: a
 * name belongs to each single bit, a combination of bits has none. */
enum {
    MOE_ENUM_FAMILY = 0,            /* these MOE_ENUM_* ids themselves */
    MOE_ENUM_STATUS = 1,            /* MOE_OK and the MOE_ERR_* statuses */
    MOE_ENUM_FEATURE = 2,           /* MOE_FEATURE_* (bits) */
    MOE_ENUM_LOG_LEVEL = 3,         /* MOE_LOG_* */
    MOE_ENUM_DEVICE = 4,            /* MOE_DEVICE_* */
    MOE_ENUM_MEM = 5,               /* MOE_MEM_* ledger categories */
    MOE_ENUM_ACTIVATION = 6,        /* MOE_ACT_* */
    MOE_ENUM_SCORE = 7,             /* MOE_SCORE_* */
    MOE_ENUM_AUX = 8,               /* MOE_AUX_* */
    MOE_ENUM_DROP = 9,              /* MOE_DROP_* */
    MOE_ENUM_DTYPE = 10,            /* MOE_DTYPE_* (INT64 included) */
    MOE_ENUM_NONFINITE = 11,        /* MOE_NONFINITE_* */
    MOE_ENUM_GRAPHS = 12,           /* MOE_GRAPHS_* */
    MOE_ENUM_LAYER_RECOMPUTE = 13,  /* MOE_LAYER_RECOMPUTE_* (bits) */
    MOE_ENUM_LAYER_OFFLOAD = 14,    /* MOE_LAYER_OFFLOAD_* (bits) */
    MOE_ENUM_QUANT = 15,            /* MOE_QUANT_* */
    MOE_ENUM_LAYER_FP8_STORE = 16,  /* MOE_LAYER_FP8_STORE_* (bits) */
    MOE_ENUM_PARAM = 17,            /* MOE_PARAM_* parameter slots */
    MOE_ENUM_GRAD_MODE = 18,        /* MOE_GRAD_* */
    MOE_ENUM_STEP_MODE = 19,        /* MOE_STEP_TRAIN, MOE_STEP_EVAL, MOE_STEP_RECOMPUTE */
    MOE_ENUM_STEP_FLAG = 20,        /* moe_step_config.flags (bits) */
    MOE_ENUM_ROUTING = 21,          /* MOE_ROUTING_* */
    MOE_ENUM_COMM = 22,             /* MOE_COMM_* communicator kinds */
    MOE_ENUM_GROUP = 23,            /* MOE_GROUP_* */
    MOE_ENUM_DISPATCHER = 24,       /* MOE_DISPATCHER_* */
    MOE_ENUM_COMBINE = 25,          /* MOE_COMBINE_* */
    MOE_ENUM_PLAN_ATTN = 26,        /* MOE_PLAN_ATTN_* */
    MOE_ENUM_PLAN_RECOMPUTE = 27,   /* MOE_RECOMPUTE_* of moe_plan_parallel */
    MOE_ENUM_PLAN_OFFLOAD = 28,     /* MOE_OFFLOAD_* of moe_plan_parallel (bits) */
    MOE_ENUM_PLAN_CATEGORY = 29,    /* the categories of moe_plan_result.bytes */
    MOE_ENUM_PLAN_COMM = 30,        /* MOE_PLAN_COMM_* */
    MOE_ENUM_STRUCT = 31,           /* MOE_STRUCT_* */
    MOE_ENUM_NONFINITE_KIND = 32,   /* MOE_NONFINITE_KIND_* */
    MOE_ENUM_STATE = 33,            /* MOE_STATE_* */
    MOE_ENUM_CHECKPOINT = 34,       /* MOE_CHECKPOINT_* (bits) */
    MOE_ENUM_MERGED = 35            /* MOE_MERGED_* (bits) */
};
/* The name of a constant as this header spells it ("MOE_ACT_GELU", "MOE_PARAM_EXPERT_FC1"), a static
 * string; NULL when the family has no constant of that value (or the family is unknown). The counts
 * (MOE_PARAM_NUM_SLOTS, ...) are no values and have no name, so a host may list a dense family by
 * asking for 0, 1, 2, ... until NULL (MOE_ENUM_DEVICE starts at 1; bit sets: 1, 2, 4, ...). */
MOE_API const char *moe_enum_name(int32_t family, int64_t value);
/* The value of the constant named `name` (the full name, as moe_enum_name returns it) in family.
 * MOE_ERR_INVALID_ARGUMENT, with a message naming the argument, when the family is unknown, name or
 * value is NULL, or the family has no such name; *value is then untouched. */
MOE_API int32_t moe_enum_value(int32_t family, const char *name, int64_t *value);

#ifdef __cplusplus
}
#endif
#endif /* MOE_H */

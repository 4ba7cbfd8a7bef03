/*
 * The MoE layer and its step tape (internal). See docs/math.md for what is computed and
 * docs/layer.md for the forward/backward data flow.
 */
#ifndef MOE_CORE_LAYER_H
#define MOE_CORE_LAYER_H

#include <stdatomic.h>

#include "runtime/runtime.h"

/* An engine-owned buffer: device memory charged to a ledger category, or (host = 1) host memory for
 * values the host itself computes and reads (GEMM row offsets, exchange counts). */
typedef struct moe_buf {
    void *p;
    size_t bytes;
    int32_t category;
    int32_t host;
} moe_buf;

int32_t moe_buf_reserve(moe_context *ctx, moe_buf *b, size_t bytes, int32_t category);
int32_t moe_buf_reserve_host(moe_context *ctx, moe_buf *b, size_t bytes);
/* The same, charged to `category` (MOE_MEM_HOST or MOE_MEM_OFFLOAD). */
int32_t moe_buf_reserve_host_as(moe_context *ctx, moe_buf *b, size_t bytes, int32_t category);
void moe_buf_release(moe_context *ctx, moe_buf *b);

/* Shape and storage of one parameter slot. */
typedef struct moe_slot_info {
    int32_t present;
    int32_t ndim;
    int64_t shape[3];
    int64_t numel;
    int32_t dtype;      /* storage dtype of the parameter (MOE_DTYPE_*) */
    int32_t grad_dtype; /* storage dtype of the gradient (the compute dtype) */
    int32_t has_grad;
} moe_slot_info;

struct moe_layer {
    atomic_int refs; /* host handle + steps + exported views */
    moe_context *ctx;
    moe_call_order order; /* the end of the layer's (or its steps') last call (runtime/entry.h) */
    moe_layer_config cfg; /* resolved: defaults filled in */
    const moe_ops *ops;   /* compute table (fp32 for fp32/bf16 layers, fp64 for fp64) */
    int32_t dtype;        /* param_dtype */
    int32_t gated;
    int64_t H, F, F1, Fs, Fs1, S;
    int32_t E, K;
    double capacity_factor; /* 0 = dropless */
    double bias_update_rate; /* u, as the decimal the host wrote */
    double aux_loss_coeff;   /* alpha, likewise (moe_float_decimal) */
    double z_loss_coeff;     /* beta, likewise */
    moe_route_params route;
    int32_t grad_mode;
    /* parallel layout (moe_layer_create_parallel); single rank: sizes 1, local dispatcher */
    const struct moe_dispatcher_ops *disp;
    moe_comm *ep_comm, *etp_comm, *aux_comm, *edp_comm, *dp_comm, *bias_comm; /* retained; may be NULL */
    int32_t ep_size, ep_rank, etp_size, etp_rank;
    int32_t E_local;      /* experts whose weights live here: E / ep_size */
    int32_t expert_first; /* global index of the first local expert */
    int64_t F_local, F1_local; /* this ETP shard of F (F1_local = 2 F_local gated) */
    int32_t num_chunks;   /* overlap chunks of the all-to-all dispatcher (1 = none) */
    struct moe_merged_worker *merged; /* the forward half's thread of merged steps (core/merged.c); NULL until used */
    struct moe_graph_cache *graphs; /* captured calls (core/graph.c); NULL until the first capture */
    moe_slot_info slot[MOE_PARAM_NUM_SLOTS];
    moe_buf param[MOE_PARAM_NUM_SLOTS];
    moe_buf grad[MOE_PARAM_NUM_SLOTS];
    /* aux-loss-free bias: tokens received per expert since the last update (device, [E] int64) */
    int64_t *bias_counts;
    /* MOE_AUX_GLOBAL running state over the micro-batches of a global batch (device, [E+2] double:
     * counts, token total, micro-batches; the aux_loss op's `global`) */
    double *global_state;
    /* host tensors attached to slots (moe_layer_attach_state): saved and loaded with their slot by the
     * checkpoints (src/ckpt); the host owns their memory */
    struct moe_state_attachment *attached;
    int32_t num_attached;
};

typedef struct moe_state_attachment {
    int32_t slot;
    int32_t dtype;   /* MOE_DTYPE_* */
    int32_t on_host; /* host memory on a device context (a CPU context's memory is host memory anyway) */
    char name[64];
    void *data;      /* contiguous, the slot's local shape */
} moe_state_attachment;

enum { MOE_STEP_STATE_EMPTY = 0, MOE_STEP_STATE_FORWARD = 1, MOE_STEP_STATE_DATA_GRAD = 2, MOE_STEP_STATE_DONE = 3,
       /* inside a merged step only: the FC2 half of the weight phase ran, the rest follows in the same call */
       MOE_STEP_STATE_WEIGHTS_HALF = 4 };

/* The tape of one forward (what backward needs) plus its routing results. Buffer sizes in the
 * comments: T tokens, R permuted rows, B aux sequences. Arrays are in the compute dtype unless noted. */
typedef struct moe_step_tape {
    moe_buf xs;          /* [T,H] input in compute dtype */
    moe_buf logits;      /* [T,E] */
    moe_buf idx;         /* [T,K] int32 */
    moe_buf probs;       /* [T,K] */
    moe_buf dropped;     /* [T,K] uint8 */
    moe_buf tokens_per_expert, kept_per_expert; /* [E], [E] int64 */
    moe_buf plan_meta;   /* [E+4] int64: the plan's expert offsets [E+1], then its stats [3] (one block, so
                          * that the host reads both with one copy) */
    moe_buf losses;      /* [2] double: aux loss, z-loss sum of squares (read when the host asks) */
    moe_buf ntok;        /* [1] int64: tokens of the aux reduction group */
    moe_buf xoff_dev;    /* [E_local+1] int64: xoff on the device, for ops (made there, or copied) */
    moe_buf row_token;   /* [R_max] int64 */
    moe_buf row_prob;    /* [R_max] */
    moe_buf slot_row;    /* [T*K] int64 */
    moe_buf aux_counts;  /* [B,E] int64 */
    moe_buf aux_sums;    /* [B,E] double */
    moe_buf aux_coef;    /* [B,E] double: dL_aux / d s^ times the step's loss scale */
    moe_buf gstate;      /* [E+2] double: the global aux state after this training forward, committed to the
                          * layer only once the forward has succeeded (a failed forward changes no layer state) */
    moe_buf z;           /* [R,F1] FC1 output */
    moe_buf zs;          /* [T,Fs1] shared FC1 output */
    moe_buf gate;        /* [T] shared gate sigma(x.w_g) */
    /* backward_data -> backward_weights */
    moe_buf dys;         /* [T,H] output gradient in compute dtype */
    moe_buf dyr;         /* [R,H] permuted output gradient */
    moe_buf dz;          /* [R,F1] */
    moe_buf dzs;         /* [T,Fs1] */
    moe_buf dgate;       /* [T] gradient of the gate logit */
    moe_buf dlogits;     /* [T,E] */
    moe_buf dprobs;      /* [T,K] */
    moe_buf dxtmp;       /* [T,H] dx in the compute dtype when the host dtype differs */
    /* expert rows (made by the dispatcher): Rx rows grouped by local expert */
    moe_buf xr;          /* [Rx,H] expert input rows (kept by communicating dispatchers) */
    moe_buf pr;          /* [Rx] their probabilities */
    moe_buf xoff;        /* [E_local+1] int64 row offsets per local expert (HOST memory: GEMM shapes) */
    moe_buf dbuf[8];     /* dispatcher-private state (counts, permutations, staging) */
    /* scratch */
    moe_buf h;           /* [R,F] (also [T,Fs]) */
    moe_buf rows;        /* [R, max(H,F1)] */
    moe_buf tok;         /* [T,H] */
    moe_buf wg16[2];     /* bf16 copies of dY_r [0] and dz [1], rounded once for both of their GEMMs (grads16) */
    moe_buf off_host[4]; /* host copies of offloaded activations (cfg.offload; core/offload.c) */
    /* quantised expert GEMMs (cfg.quant_recipe; core/experts_quant.c), workspace: codes and block
     * scales of the two operands, their fp32 staging (transposes, widened bf16 weights), gemm_q's
     * scratch, the NVFP4 tensor scales [2] fp32, and the saturation counters [2] int64 (the step's,
     * and a discarded one for recomputes) */
    moe_buf qcode[2], qscale[2], qstage[2], qwork, qtensor, qsat;
    /* FP8 storage of saved activations (cfg.fp8_storage; core/fp8_storage.c): E4M3 codes and 1x128
     * scales of the FC1 output [0] and of the expert input rows [1] */
    moe_buf f8code[2], f8scale[2];
} moe_step_tape;

/* What the host knows of a step's routing: the one copy of the plan's offsets and stats
 * (moe_step_plan_to_host), made where the host needs row counts (dropless routing, capacity without
 * padding, expert parallelism) and skipped in static-shape steps. */
typedef struct moe_step_host {
    moe_buf plan_buf;  /* backend host memory behind plan */
    int64_t *plan;     /* [E+4] host mirror of tape.plan_meta (NULL until first needed) */
    int32_t have_plan; /* plan holds this step's values */
} moe_step_host;

struct moe_step {
    moe_layer *layer;
    int32_t mode;
    double aux_loss_scale;
    int32_t state;
    int32_t reserved; /* the step reserved its buffers for this call: later growth is counted */
    void *stream;     /* the stream of the step's last call: its buffers are freed in that order */
    int64_t T, R, B, capacity;
    int64_t Rx; /* expert rows on this rank (after dispatch) */
    const void *wgrad_xr; /* the expert input rows between the two halves of the weight phase */
    /* 1 when this step's backward_data rounded dY_r and dz to bf16 once (tape.wg16) for the data- and
     * the weight-gradient GEMMs (moe_experts_reserve_grads16); decided there, read by the weight phase */
    int32_t grads16;
    moe_step_host host;
    moe_step_tape tape;
    /* what the step holds, in ledger bytes (moe_step_memory_stats): ACTIVATIONS and HOST */
    int64_t mem_cur[MOE_MEM_NUM_CATEGORIES], mem_peak[MOE_MEM_NUM_CATEGORIES], mem_total_peak;
    int32_t mem_live;
    int64_t off_bytes[4]; /* device bytes of each offloaded buffer now on the host (0: none) */
    /* offload copies on the context's copy stream (core/offload.c): copy_event marks the last one
     * (created on first use, recorded when copy_recorded); reload_pending: the reload is queued there
     * and the next call on the step's tape waits for copy_event first */
    void *copy_event;
    int32_t copy_recorded, reload_pending;
};

/* Offload (core/offload.c): the selected saved activations to host memory at the end of forward, and
 * back before backward needs them, on the context's copy stream. */
int32_t moe_offload_after_forward(moe_layer *L, moe_step *step, const moe_exec *e);
int32_t moe_offload_before_backward(moe_layer *L, moe_step *step, const moe_exec *e);
/* moe_step_prefetch: queues the reload on the copy stream after e's stream; no-op when nothing is
 * offloaded or the reload is queued already. */
int32_t moe_offload_prefetch(moe_layer *L, moe_step *step, const moe_exec *e);
/* Before a call rewrites the step's tape: e's stream waits for a queued reload (forward after a
 * prefetch without backward). */
int32_t moe_offload_settle(moe_step *step, const moe_exec *e);
/* Allocates every tape buffer a forward of T tokens writes (forward.c; also called before a graph
 * capture, so that the capture allocates nothing). */
int32_t moe_layer_reserve_forward(moe_layer *L, moe_step *step, int64_t T, const moe_exec *e);
/* layer_traits.c. Static shapes (no host copy of routing results, graph-capturable): capacity with
 * padding on one rank. */
int moe_layer_static_shapes(const moe_layer *L);
/* Graphs a layer may use at all (backend, config, static shapes, one rank, no chunking). */
int moe_graph_eligible(const moe_layer *L);
/* The one device-to-host copy of a step's plan offsets and stats; a no-op when already made. */
int32_t moe_step_plan_to_host(moe_step *step, const moe_exec *ex);
/* Host pointers into the copied plan: offsets [E+1] and stats [3] (R, dropped, padded). */
static inline const int64_t *moe_step_host_offsets(const moe_step *s) { return s->host.plan; }
static inline const int64_t *moe_step_host_stats(const moe_step *s) { return s->host.plan + s->layer->E + 1; }
/* Device pointers into tape.plan_meta. */
static inline int64_t *moe_step_offsets(const moe_step *s) { return (int64_t *)s->tape.plan_meta.p; }

/* Bytes per element of a MOE_DTYPE_* (fp32, bf16, fp64, int64). */
size_t moe_dtype_size(int32_t dtype);
/* layer_config.c: validates cfg and fills the layer's resolved fields (no allocation). */
int32_t moe_layer_resolve_config(moe_context *ctx, const moe_layer_config *cfg, moe_layer *layer);
/* params.c */
int32_t moe_layer_alloc_params(moe_layer *layer);
void moe_layer_free_params(moe_layer *layer);
int32_t moe_layer_init_params_impl(moe_layer *layer, uint64_t seed);
/* layer_lifetime.c: the last reference frees the layer's graphs, parameters and comms */
void moe_layer_retain(moe_layer *layer);
void moe_layer_release_ref(moe_layer *layer);
/* A parameter as a GEMM operand: its storage and storage dtype, which the GEMM ops take as they are
 * (bf16 for the expert and shared-expert weights of bf16 layers, else the compute dtype). */
const void *moe_layer_weight(const moe_layer *layer, int32_t slot);
int32_t moe_layer_weight_dtype(const moe_layer *layer, int32_t slot);
/* The two GEMM-op arguments of a weight operand: pointer, dtype. */
#define WEIGHT_ARGS(L, slot) moe_layer_weight((L), (slot)), moe_layer_weight_dtype((L), (slot))
/* Capacity per expert of T local tokens (docs/math.md §4.1); -1 = dropless. Shared by the layer and the
 * standalone dispatcher, so both drop the same assignments. */
int64_t moe_layer_capacity(const moe_layer *L, int64_t T);
/* Most rows a dispatch plan of T tokens with capacity C can hold: T*K dropless, E*C padded, else
 * min(T*K, E*C). */
int64_t moe_plan_rows_max(const moe_layer *L, int64_t T, int64_t C);
/* forward.c / backward.c: tensors already validated by src/api. x/y/dy/dx data pointers are in the
 * layer's dtype, contiguous. */
int32_t moe_layer_forward_impl(moe_layer *layer, moe_step *step, int64_t T, const void *x, void *y, const moe_exec *e);
int32_t moe_layer_backward_data_impl(moe_layer *layer, moe_step *step, const void *dy, void *dx, const moe_exec *e);
int32_t moe_layer_backward_weights_impl(moe_layer *layer, moe_step *step, const moe_exec *e);
/* backward_weights_impl in two halves (merged steps): the FC2 gradient after all of the phase's
 * reservations, then the rest; fc2 then rest == impl, bitwise. */
int32_t moe_layer_backward_weights_fc2(moe_layer *layer, moe_step *step, const moe_exec *e);
int32_t moe_layer_backward_weights_rest(moe_layer *layer, moe_step *step, const moe_exec *e);
void moe_step_free_tape(moe_step *step);

/* The merged step (core/merged.c, moe_layer_forward_backward): the weight gradients of `wgrad`, the
 * forward of `fwd` and the backward of `bwd` (each NULL for none; weights of bwd unless defer), with
 * the forward and the backward on two lanes (runtime/lanes.h) when the layer exchanges anything. */
typedef struct moe_merged_parts {
    moe_step *wgrad;
    moe_step *fwd;
    int64_t T;
    const void *x;
    void *y;
    moe_step *bwd;
    const void *dy;
    void *dx;
    int32_t defer;
} moe_merged_parts;
int32_t moe_layer_merged_run(moe_layer *L, const moe_merged_parts *p, const moe_exec *e);
/* Stops and frees the layer's merged-step thread (layer teardown). */
void moe_merged_worker_free(moe_layer *L);
/* Recounts what the step holds (after its buffers changed) and updates its peaks. */
void moe_step_note_memory(moe_step *step);
/* Reserves a tape buffer of n elements of es bytes (overflow-checked), charged to ACTIVATIONS. A
 * buffer that has to grow while step->reserved is set counts in ctx->inflight_allocs. */
int32_t moe_step_need(moe_step *step, moe_buf *b, int64_t n, size_t es);
/* The same for a host buffer (charged to MOE_MEM_HOST: metadata the host computes with). */
int32_t moe_step_need_host(moe_step *step, moe_buf *b, int64_t n, size_t es);
/* Routing statistics and loss values of the last forward, read from the device (copies). */
int32_t moe_step_read_stats(moe_step *step, int64_t stats[3], double *aux_loss, double *z_loss);

/* Calls an op of layer L's table; a failure becomes an error naming the op. */
#define OP(fn, ...)                                                                                                  \
    do {                                                                                                             \
        int32_t st_ = L->ops->fn(__VA_ARGS__);                                                                       \
        if (st_ != MOE_OK) return moe_errorf(L->ctx, st_, "op %s of backend %s failed", #fn, L->ops->name);          \
    } while (0)

#endif /* MOE_CORE_LAYER_H */

/*
 * CUDA Graphs for static-shape steps (src/core/graph.c). A layer call (forward, backward_data,
 * backward_weights) whose shapes are static and whose buffers are already in place runs eagerly once,
 * is captured at its second call on the backend's stream and replayed afterwards; docs/cuda.md
 * ("CUDA Graphs") says what is captured.
 */
#ifndef MOE_CORE_GRAPH_H
#define MOE_CORE_GRAPH_H

#include "core/layer.h"

enum { MOE_GRAPH_FORWARD = 0, MOE_GRAPH_BACKWARD_DATA = 1, MOE_GRAPH_BACKWARD_WEIGHTS = 2, MOE_GRAPH_PHASES = 3 };

/* The body of one call: what runs eagerly, or inside the capture. */
typedef int32_t (*moe_graph_body)(moe_layer *L, moe_step *step, const moe_exec *e, void *arg);

/* Runs body for `phase` of step: eagerly when graphs do not apply; else replays the graph of this
 * call's key (shapes, data and buffer pointers, stream, mode, loss scale), or, the first time the
 * phase meets the key, runs eagerly (the warm-up: lazy module loading and first library use happen
 * outside any capture), and from the second time captures it (and then launches it). in/out: the
 * call's host-visible data pointers (part of the key). A capture that fails (the body allocates, or
 * reads the device back) is dropped and the call runs eagerly. */
int32_t moe_graph_run(moe_layer *L, moe_step *step, int32_t phase, const moe_exec *e, const void *in, const void *out,
                      moe_graph_body body, void *arg);
/* The layer calls of the ABI: the *_impl functions, through moe_graph_run. */
int32_t moe_layer_forward_run(moe_layer *L, moe_step *step, int64_t T, const void *x, void *y, const moe_exec *e);
int32_t moe_layer_backward_data_run(moe_layer *L, moe_step *step, const void *dy, void *dx, const moe_exec *e);
int32_t moe_layer_backward_weights_run(moe_layer *L, moe_step *step, const moe_exec *e);
/* Destroys the layer's graphs (layer teardown). */
void moe_graph_cache_free(moe_layer *L);

#endif

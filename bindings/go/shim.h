/*
 * C side of the Go binding. Two jobs that Go cannot do itself:
 *  - bind a Go slice's data pointer into a DLTensor that lives in C memory for the length of one call
 *    only (cgo forbids Go from storing a Go pointer in C memory; C may hold it during the call);
 *  - fill hook tables whose callbacks are C trampolines into exported Go functions, with a
 *    runtime/cgo.Handle as user_data.
 */
#ifndef GOMOE_SHIM_H
#define GOMOE_SHIM_H

#include <stdint.h>
#include <stdlib.h>

#include "moe.h"

/* ---- tensor descriptors (C memory; a Go slice's data is only bound during a call) */
/* addr: the data address of a device tensor (memory Go does not manage, never a Go pointer; 0 for a
 * tensor over a Go slice, whose data gomoe_bind sets per call). */
DLTensor *gomoe_tensor_new(uint8_t code, uint8_t bits, int32_t ndim, const int64_t *shape, int32_t device_type,
                           int32_t device_id, uintptr_t addr);
void gomoe_tensor_free(DLTensor *t);
/* Sets t->data to a Go slice's data (t may be NULL: an absent optional tensor; data NULL keeps a device
 * tensor's address) and returns t. */
DLTensor *gomoe_bind(DLTensor *t, void *data);
/* Clears the data pointers again: C must not keep a Go pointer once the call returns. */
void gomoe_unbind(DLTensor *a, DLTensor *b, DLTensor *c, DLTensor *d);

/* ---- calls that take tensors: each binds the data pointers, calls, and unbinds them. stream is the
 * caller's opaque handle (a cudaStream_t, 0 = the context's stream), passed on unchanged; it travels as
 * an integer so that Go never holds it as a pointer. */
int32_t gomoe_layer_forward(moe_layer *l, moe_step *s, DLTensor *x, void *xd, DLTensor *y, void *yd, uintptr_t stream);
int32_t gomoe_layer_backward(moe_layer *l, moe_step *s, DLTensor *dy, void *dyd, DLTensor *dx, void *dxd,
                             uintptr_t stream);
int32_t gomoe_layer_backward_data(moe_layer *l, moe_step *s, DLTensor *dy, void *dyd, DLTensor *dx, void *dxd,
                                  uintptr_t stream);
int32_t gomoe_layer_backward_weights(moe_layer *l, moe_step *s, uintptr_t stream);
/* moe_layer_forward_backward: the moe_merged_step is filled here, in C memory, from the parts (a NULL
 * step leaves its part out, a NULL tensor is an absent one). */
int32_t gomoe_layer_forward_backward(moe_layer *l, moe_step *fs, DLTensor *x, void *xd, DLTensor *y, void *yd,
                                     moe_step *bs, DLTensor *dy, void *dyd, DLTensor *dx, void *dxd, moe_step *ws,
                                     int32_t flags, uintptr_t stream);
int32_t gomoe_step_prefetch(moe_step *s, uintptr_t stream);
int32_t gomoe_layer_reduce_grads(moe_layer *l, uintptr_t stream);
int32_t gomoe_layer_check_gradients(const moe_layer *l, moe_nonfinite_report *out, uintptr_t stream);
int32_t gomoe_context_memory_trim(moe_context *ctx, uintptr_t stream);
int32_t gomoe_layer_import_param(moe_layer *l, int32_t slot, DLTensor *src, void *srcd);
int32_t gomoe_layer_export_param(moe_layer *l, int32_t slot, int32_t grad, DLTensor *dst, void *dstd);
int32_t gomoe_layer_expert_counts(const moe_layer *l, DLTensor *out, void *outd);
int32_t gomoe_layer_update_expert_bias(moe_layer *l, DLTensor *counts, void *countsd);
int32_t gomoe_dispatcher_dispatch(moe_dispatcher *d, DLTensor *x, void *xd, DLTensor *idx, void *idxd, DLTensor *p,
                                  void *pd, moe_dispatch **out, uintptr_t stream);
int32_t gomoe_dispatch_rows(const moe_dispatch *h, DLTensor *xr, void *xrd, DLTensor *rp, void *rpd, DLTensor *tpe,
                            void *tped);
int32_t gomoe_dispatch_combine(moe_dispatch *h, DLTensor *yr, void *yrd, DLTensor *y, void *yd, uintptr_t stream);
int32_t gomoe_dispatch_combine_backward(moe_dispatch *h, DLTensor *dy, void *dyd, DLTensor *dyr, void *dyrd,
                                        DLTensor *drp, void *drpd, uintptr_t stream);
int32_t gomoe_dispatch_backward(moe_dispatch *h, DLTensor *dxr, void *dxrd, DLTensor *drp, void *drpd, DLTensor *dx,
                                void *dxd, DLTensor *dp, void *dpd, uintptr_t stream);

/* ---- exported views: Go cannot call a C function pointer */
void gomoe_managed_delete(DLManagedTensor *mt);

/* ---- hook tables (caller frees them with free() once the engine copied them) */
moe_logger *gomoe_logger_new(uintptr_t handle, int32_t max_level);
moe_allocator *gomoe_allocator_new(uintptr_t handle);
moe_profiler *gomoe_profiler_new(uintptr_t handle);
moe_comm_hooks *gomoe_comm_hooks_new(uintptr_t handle, int32_t rank, int32_t size, int32_t with_barrier);

/* ---- plain C memory for allocator hooks written in Go */
void *gomoe_aligned_alloc(size_t bytes, size_t alignment);

#endif

/*
 * A layer's state dictionary (abi/moe.h "checkpoints"): the named tensors that make up its training
 * state, each with its global shape and the box of it this rank holds, and where its bytes live.
 */
#ifndef MOE_CKPT_STATE_H
#define MOE_CKPT_STATE_H

#include "core/layer.h"

typedef struct moe_ckpt_item {
    moe_state_entry e; /* the public description (struct_size = sizeof) */
    void *data;        /* this rank's box, contiguous: device memory of the layer's context, or host */
    int32_t on_host;   /* data is host memory (companions the host keeps there) */
    int64_t numel;     /* elements of the box */
} moe_ckpt_item;

/* The entries, in the documented order; *out is moe_host_malloc'd (moe_host_free it). */
int32_t moe_ckpt_items(const moe_layer *L, int32_t flags, moe_ckpt_item **out, int32_t *count);
/* The slot's entry name ("experts.fc1.weight"), or NULL for an absent slot number. */
const char *moe_ckpt_slot_name(int32_t slot);
/* A name the host may give a companion or a checkpoint: 1-63 characters of [A-Za-z0-9_.-]. */
int moe_ckpt_name_ok(const char *name);

#endif /* MOE_CKPT_STATE_H */

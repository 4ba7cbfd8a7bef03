/*
 * The demo's checkpoints (--save, --save-every, --resume): everything a run needs to go on exactly as
 * if it had not stopped. The layers' state is libmoe's (moe_layer_save / moe_layer_load, with the Adam
 * moments of their parameters attached by moe_layer_attach_state); the rest is the host's: the
 * embedding, head and bias with their moments, the step counter, the batch sampler's RNG, the loss
 * history. A checkpoint is a directory PATH:
 *
 *   PATH/demo_state.json    the record: the step, the run's options, the host's scalars, and which of
 *                           the two slots below holds the rest. Renaming it into place commits a save.
 *   PATH/slot-a/, slot-b/   used in turn: a save fills the slot the record does not name, then commits
 *                           it, so a crash at any point leaves the previous checkpoint or the new one
 *     layer<l>.index.json, layer<l>-<generation>-rank0-of1.safetensors   moe_layer_save of layer l
 *     host.bin              the host's arrays (named, sized, with a checksum)
 *
 * Every file the demo writes itself goes to a temporary name, is flushed and renamed. Every function
 * here reports a failure (the engine's message for the engine's calls) and exits with 1.
 */
#ifndef DEMO_CHECKPOINT_H
#define DEMO_CHECKPOINT_H

#include "model.h"

#include <stddef.h>
#include <stdint.h>

/* What demo_state.json holds. */
typedef struct demo_ckpt_record {
    int step;                  /* steps done */
    int steps;                 /* the run's length (the learning-rate schedule) */
    int layers, experts, top_k;
    float aux;
    uint64_t seed;
    int64_t adam_steps;        /* Adam's step count (its bias correction) */
    uint64_t rng[4];           /* the training batches' sampler */
    double loss_ema;           /* the smoothed loss's moving average, before bias correction */
    double loss, loss_smooth;  /* the last step's (for people reading the file; not read back) */
    int expected_points;       /* entries of the expected-loss history in host.bin */
    int window_start;          /* the routing window of the next table starts after this step */
    int64_t held_after_forward, offloaded_after_forward, quant_saturated; /* the summary's figures */
    char slot[16];             /* "slot-a" or "slot-b" */
} demo_ckpt_record;

/* One host array of host.bin. */
typedef struct demo_ckpt_array {
    char name[64];
    void *data;
    size_t bytes;
} demo_ckpt_array;

/* Reads PATH/demo_state.json into rec (exits with a message when it is missing or malformed). */
void demo_ckpt_read_record(const char *path, demo_ckpt_record *rec);
/* Creates the directory PATH when missing and checks that it can be written (before the training). */
void demo_ckpt_prepare(const char *path);
/* Attaches the Adam moments of every layer parameter to its slot as "exp_avg" and "exp_avg_sq", so
 * that the layers' checkpoints hold them. */
void demo_ckpt_attach_moments(demo_model *m);
/* Saves into PATH (created when missing): the layers, the arrays, then the record (rec->slot is set
 * to the slot written). */
void demo_ckpt_save(demo_model *m, const char *path, demo_ckpt_record *rec, const demo_ckpt_array *arrays,
                    int count);
/* Loads the checkpoint rec (from demo_ckpt_read_record(PATH)) names into the layers and the arrays,
 * which must have the names and sizes saved. */
void demo_ckpt_load(demo_model *m, const char *path, const demo_ckpt_record *rec, const demo_ckpt_array *arrays,
                    int count);

#endif

/* The state dictionary (state.h). Names are part of the ABI: docs/checkpoints.md lists them. */
#include <stdio.h>
#include <string.h>

#include "base/host_alloc.h"
#include "ckpt/state.h"

static const char *const slot_names[MOE_PARAM_NUM_SLOTS] = {
    "router.weight",     "experts.fc1.weight", "experts.fc2.weight", "shared.fc1.weight",
    "shared.fc2.weight", "shared.gate.weight", "router.expert_bias"};

const char *moe_ckpt_slot_name(int32_t slot)
{
    return slot >= 0 && slot < MOE_PARAM_NUM_SLOTS ? slot_names[slot] : NULL;
}

int moe_ckpt_name_ok(const char *name)
{
    if (!name) return 0;
    size_t n = strlen(name);
    if (n == 0 || n > 63) return 0;
    for (size_t i = 0; i < n; i++) {
        const char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-'))
            return 0;
    }
    return 1;
}

/* The slicing of a slot: global shape, the view it is cut in, and this rank's box (a replicated slot:
 * the whole view). Expert slots are cut by EP along E and by ETP along F. */
static void slot_geometry(const moe_layer *L, int32_t slot, moe_state_entry *e)
{
    const moe_slot_info *si = &L->slot[slot];
    const int64_t E = L->E, H = L->H, F = L->F, El = L->E_local, Fl = L->F_local;
    const int64_t e0 = L->expert_first, f0 = (int64_t)L->etp_rank * Fl;
    e->ndim = si->ndim;
    for (int d = 0; d < si->ndim; d++) e->shape[d] = si->shape[d];
    if (slot == MOE_PARAM_EXPERT_FC1) {
        e->shape[0] = E, e->shape[1] = L->F1, e->shape[2] = H;
        if (L->gated) { /* [E, 2, F, H]: the shard's gate rows and up rows are one box */
            const int64_t vs[4] = {E, 2, F, H}, of[4] = {e0, 0, f0, 0}, ln[4] = {El, 2, Fl, H};
            e->view_ndim = 4;
            memcpy(e->view_shape, vs, sizeof vs), memcpy(e->offset, of, sizeof of), memcpy(e->length, ln, sizeof ln);
        } else {
            const int64_t vs[3] = {E, F, H}, of[3] = {e0, f0, 0}, ln[3] = {El, Fl, H};
            e->view_ndim = 3;
            memcpy(e->view_shape, vs, sizeof vs), memcpy(e->offset, of, sizeof of), memcpy(e->length, ln, sizeof ln);
        }
        return;
    }
    if (slot == MOE_PARAM_EXPERT_FC2) {
        const int64_t vs[3] = {E, H, F}, of[3] = {e0, 0, f0}, ln[3] = {El, H, Fl};
        memcpy(e->shape, vs, sizeof vs);
        e->view_ndim = 3;
        memcpy(e->view_shape, vs, sizeof vs), memcpy(e->offset, of, sizeof of), memcpy(e->length, ln, sizeof ln);
        return;
    }
    e->view_ndim = e->ndim; /* replicated: router, shared expert, expert bias */
    for (int d = 0; d < e->ndim; d++) e->view_shape[d] = e->shape[d], e->offset[d] = 0, e->length[d] = e->shape[d];
}

static void add(moe_ckpt_item *it, int32_t *n, const moe_state_entry *e, void *data, int32_t on_host, int64_t numel)
{
    if (it) {
        it[*n].e = *e;
        it[*n].data = data;
        it[*n].on_host = on_host;
        it[*n].numel = numel;
    }
    (*n)++;
}

static void name_of(moe_state_entry *e, const char *base, const char *suffix)
{
    snprintf(e->name, sizeof e->name, "%s%s%s", base, suffix ? "." : "", suffix ? suffix : "");
}

/* Lists the entries into it (NULL: counts them). */
static int32_t list(const moe_layer *L, int32_t flags, moe_ckpt_item *it)
{
    int32_t n = 0;
    for (int pass = 0; pass < 2; pass++) { /* parameters, then gradients */
        if (pass == 1 && !(flags & MOE_CHECKPOINT_GRADS)) break;
        for (int32_t s = 0; s < MOE_PARAM_NUM_SLOTS; s++) {
            const moe_slot_info *si = &L->slot[s];
            if (!si->present || (pass == 1 && !si->has_grad)) continue;
            moe_state_entry e = {.struct_size = sizeof e, .kind = pass ? MOE_STATE_GRAD : MOE_STATE_PARAM, .slot = s,
                                 .dtype = pass ? si->grad_dtype : si->dtype};
            slot_geometry(L, s, &e);
            name_of(&e, slot_names[s], pass ? "grad" : NULL);
            add(it, &n, &e, pass ? L->grad[s].p : L->param[s].p, 0, si->numel);
        }
    }
    /* per-rank accumulators: present when the config uses them */
    if (L->cfg.expert_bias) {
        moe_state_entry e = {.struct_size = sizeof e, .kind = MOE_STATE_ACCUMULATOR, .slot = -1,
                             .dtype = MOE_DTYPE_INT64, .ndim = 1, .view_ndim = 1};
        e.shape[0] = e.view_shape[0] = e.length[0] = L->E;
        name_of(&e, "router.expert_bias.counts", NULL);
        add(it, &n, &e, L->bias_counts, 0, L->E);
    }
    if (L->cfg.aux_loss_type == MOE_AUX_GLOBAL) {
        moe_state_entry e = {.struct_size = sizeof e, .kind = MOE_STATE_ACCUMULATOR, .slot = -1,
                             .dtype = MOE_DTYPE_FP64, .ndim = 1, .view_ndim = 1};
        e.shape[0] = e.view_shape[0] = e.length[0] = L->E + 2;
        name_of(&e, "router.aux_global.state", NULL);
        add(it, &n, &e, L->global_state, 0, L->E + 2);
    }
    for (int32_t a = 0; a < L->num_attached; a++) {
        const moe_state_attachment *at = &L->attached[a];
        moe_state_entry e = {.struct_size = sizeof e, .kind = MOE_STATE_COMPANION, .slot = at->slot, .dtype = at->dtype};
        slot_geometry(L, at->slot, &e);
        name_of(&e, slot_names[at->slot], at->name);
        add(it, &n, &e, at->data, at->on_host, L->slot[at->slot].numel);
    }
    return n;
}

int32_t moe_ckpt_items(const moe_layer *L, int32_t flags, moe_ckpt_item **out, int32_t *count)
{
    const int32_t n = list(L, flags, NULL);
    moe_ckpt_item *it = moe_host_calloc((size_t)(n > 0 ? n : 1), sizeof *it);
    if (!it) return MOE_ERR_OUT_OF_MEMORY;
    list(L, flags, it);
    *out = it;
    *count = n;
    return MOE_OK;
}

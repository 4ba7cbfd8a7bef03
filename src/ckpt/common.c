/* What saving and loading share (ckpt.h). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/bf16.h"
#include "base/host_alloc.h"
#include "ckpt/ckpt.h"
#include "comm/comm.h"

/* The config fields that decide the state's shapes or what a step computes with it. Execution choices
 * (param_dtype: load converts; graphs, recompute, offload, quant_recipe, fp8_storage, nonfinite_policy,
 * seed) may differ between the saving and the loading layer. */
char *moe_ckpt_config_json(const moe_layer *L)
{
    const moe_layer_config *c = &L->cfg;
    json_t *o = json_pack("{s:I, s:I, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:i, s:f, s:i, s:f, s:I, s:f, s:f, s:i, s:i,"
                          " s:I, s:i}",
                          "hidden_size", (json_int_t)c->hidden_size, "ffn_hidden_size", (json_int_t)c->ffn_hidden_size,
                          "num_experts", c->num_experts, "top_k", c->top_k, "activation", c->activation,
                          "score_function", c->score_function, "num_groups", c->num_groups, "group_topk",
                          c->group_topk, "scaling_factor", (double)c->scaling_factor, "expert_bias", c->expert_bias,
                          "bias_update_rate", (double)c->bias_update_rate, "aux_loss_type", c->aux_loss_type,
                          "aux_loss_coeff", (double)c->aux_loss_coeff, "seq_length", (json_int_t)c->seq_length,
                          "z_loss_coeff", (double)c->z_loss_coeff, "capacity_factor", (double)c->capacity_factor,
                          "drop_policy", c->drop_policy, "pad_to_capacity", c->pad_to_capacity,
                          "shared_ffn_hidden_size", (json_int_t)c->shared_ffn_hidden_size, "shared_gate",
                          c->shared_gate);
    if (!o) return NULL;
    char *text = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    if (!text) return NULL;
    char *out = moe_host_malloc(strlen(text) + 1);
    if (out) strcpy(out, text);
    free(text);
    return out;
}

int32_t moe_ckpt_config_check(const moe_layer *L, const char *saved, char *msg, size_t cap)
{
    int32_t rc = MOE_ERR_OUT_OF_MEMORY;
    char *mine_text = moe_ckpt_config_json(L);
    json_t *mine = mine_text ? json_loads(mine_text, 0, NULL) : NULL, *theirs = json_loads(saved, 0, NULL);
    if (!mine) {
        snprintf(msg, cap, "out of memory");
        goto done;
    }
    if (!json_is_object(theirs)) {
        rc = MOE_ERR_IO;
        snprintf(msg, cap, "its libmoe.config is not a JSON object");
        goto done;
    }
    rc = MOE_OK;
    const char *key;
    json_t *v;
    json_object_foreach(mine, key, v) {
        const json_t *w = json_object_get(theirs, key);
        if (w && json_equal(v, w)) continue;
        char *a = json_dumps(v, JSON_ENCODE_ANY), *b = w ? json_dumps(w, JSON_ENCODE_ANY) : NULL;
        snprintf(msg, cap, "it was saved by a layer with %s = %s; this layer has %s = %s", key, b ? b : "(none)", key,
                 a ? a : "?");
        free(a), free(b);
        rc = MOE_ERR_INVALID_ARGUMENT;
        break;
    }
done:
    json_decref(mine), json_decref(theirs);
    moe_host_free(mine_text);
    return rc;
}

char *moe_ckpt_join(const char *dir, const char *file)
{
    const size_t n = strlen(dir) + strlen(file) + 2;
    char *p = moe_host_malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, file);
    return p;
}

char *moe_ckpt_index_path(const moe_ckpt_opts *o)
{
    char file[96];
    snprintf(file, sizeof file, "%s.index.json", o->name);
    return moe_ckpt_join(o->dir, file);
}

char *moe_ckpt_file_name(const moe_ckpt_opts *o, const char *gen, int32_t rank, int32_t ranks)
{
    const size_t n = strlen(o->name) + strlen(gen) + 64;
    char *p = moe_host_malloc(n);
    if (p) snprintf(p, n, "%s-%s-rank%05d-of%05d.safetensors", o->name, gen, rank, ranks);
    return p;
}

int32_t moe_ckpt_gather(moe_comm *comm, const int64_t *v, int32_t k, int64_t *all)
{
    if (!comm || comm->size == 1) {
        memcpy(all, v, (size_t)k * sizeof *v);
        return MOE_OK;
    }
    const int32_t n = comm->size;
    int64_t *bytes = moe_host_calloc((size_t)n * 2, sizeof *bytes), *offs = bytes + n;
    if (!bytes) return MOE_ERR_OUT_OF_MEMORY; /* the peers then time out in the collective: no hang */
    for (int32_t p = 0; p < n; p++) bytes[p] = k * (int64_t)sizeof(int64_t), offs[p] = p * bytes[p];
    const int32_t rc = moe_comm_all_gather_v_host(comm, v, k * (int64_t)sizeof(int64_t), all, bytes, offs, NULL);
    moe_host_free(bytes);
    return rc;
}

int32_t moe_ckpt_agree(moe_comm *comm, int32_t rc, int32_t *bad)
{
    *bad = rc == MOE_OK ? -1 : (comm ? comm->rank : 0);
    if (!comm || comm->size == 1) return rc;
    int64_t *all = moe_host_calloc((size_t)comm->size, sizeof *all);
    if (!all) return MOE_ERR_OUT_OF_MEMORY; /* the peers then time out in the collective: no hang */
    const int64_t mine = rc;
    int32_t st = moe_ckpt_gather(comm, &mine, 1, all);
    if (st == MOE_OK) {
        for (int32_t p = 0; p < comm->size; p++)
            if (all[p] != MOE_OK) {
                *bad = p;
                st = (int32_t)all[p];
                break;
            }
    } else {
        *bad = comm->rank;
    }
    moe_host_free(all);
    return st;
}

size_t moe_ckpt_dtype_bytes(int32_t dt) { return dt == MOE_DTYPE_BF16 ? 2 : dt == MOE_DTYPE_FP32 ? 4 : 8; }

int moe_ckpt_exact(int32_t from, int32_t to)
{
    if (from == to) return 1;
    if (from == MOE_DTYPE_INT64 || to == MOE_DTYPE_INT64) return 0;
    /* widening: bf16 -> fp32 -> fp64 */
    const int rank_from = from == MOE_DTYPE_BF16 ? 0 : from == MOE_DTYPE_FP32 ? 1 : 2;
    const int rank_to = to == MOE_DTYPE_BF16 ? 0 : to == MOE_DTYPE_FP32 ? 1 : 2;
    return rank_from < rank_to;
}

static double load_elem(const void *p, int32_t dt, int64_t i)
{
    switch (dt) {
    case MOE_DTYPE_BF16: return (double)bf16_to_f32(((const uint16_t *)p)[i]);
    case MOE_DTYPE_FP32: return (double)((const float *)p)[i];
    default: return ((const double *)p)[i];
    }
}

void moe_ckpt_convert(const void *src, int32_t sdt, void *dst, int32_t ddt, int64_t n)
{
    if (sdt == ddt) {
        memcpy(dst, src, (size_t)n * moe_ckpt_dtype_bytes(sdt));
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const double v = load_elem(src, sdt, i);
        /* fp64 -> bf16 goes through fp32 (the one rounding the CAST flag documents) */
        if (ddt == MOE_DTYPE_BF16) ((uint16_t *)dst)[i] = f32_to_bf16((float)v);
        else if (ddt == MOE_DTYPE_FP32) ((float *)dst)[i] = (float)v;
        else ((double *)dst)[i] = v;
    }
}

/* Both boxes padded to 4 dimensions (leading 1s), and their intersection [lo, hi). */
static int64_t intersect(int32_t nd, const int64_t *ao, const int64_t *al, const int64_t *bo, const int64_t *bl,
                         int64_t lo[4], int64_t hi[4])
{
    int64_t vol = 1;
    for (int32_t d = 0; d < 4; d++) {
        const int32_t k = d - (4 - nd);
        const int64_t a0 = k < 0 ? 0 : ao[k], a1 = k < 0 ? 1 : ao[k] + al[k];
        const int64_t b0 = k < 0 ? 0 : bo[k], b1 = k < 0 ? 1 : bo[k] + bl[k];
        lo[d] = a0 > b0 ? a0 : b0;
        hi[d] = a1 < b1 ? a1 : b1;
        if (hi[d] <= lo[d]) return 0;
        vol *= hi[d] - lo[d];
    }
    return vol;
}

int64_t moe_ckpt_overlap(int32_t ndim, const int64_t *a_off, const int64_t *a_len, const int64_t *b_off,
                         const int64_t *b_len)
{
    int64_t lo[4], hi[4];
    return intersect(ndim, a_off, a_len, b_off, b_len, lo, hi);
}

int64_t moe_ckpt_copy_box(int32_t nd, const int64_t *so, const int64_t *sl, const void *sp, int32_t sdt,
                          const int64_t *dof, const int64_t *dl, void *dp, int32_t ddt)
{
    int64_t lo[4], hi[4], s0[4], sn[4], d0[4], dn[4];
    const int64_t vol = intersect(nd, so, sl, dof, dl, lo, hi);
    if (vol == 0) return 0;
    for (int32_t d = 0; d < 4; d++) {
        const int32_t k = d - (4 - nd);
        s0[d] = k < 0 ? 0 : so[k], sn[d] = k < 0 ? 1 : sl[k];
        d0[d] = k < 0 ? 0 : dof[k], dn[d] = k < 0 ? 1 : dl[k];
    }
    const size_t ses = moe_ckpt_dtype_bytes(sdt), des = moe_ckpt_dtype_bytes(ddt);
    const int64_t run = hi[3] - lo[3];
    for (int64_t i = lo[0]; i < hi[0]; i++)
        for (int64_t j = lo[1]; j < hi[1]; j++)
            for (int64_t k = lo[2]; k < hi[2]; k++) {
                const int64_t s = (((i - s0[0]) * sn[1] + (j - s0[1])) * sn[2] + (k - s0[2])) * sn[3] + (lo[3] - s0[3]);
                const int64_t d = (((i - d0[0]) * dn[1] + (j - d0[1])) * dn[2] + (k - d0[2])) * dn[3] + (lo[3] - d0[3]);
                moe_ckpt_convert((const char *)sp + (size_t)s * ses, sdt, (char *)dp + (size_t)d * des, ddt, run);
            }
    return vol;
}

/*
 * Checkpoints of a layer (abi/moe.h "checkpoints", docs/checkpoints.md): save.c writes this rank's
 * state and commits the set, load.c reads any set back onto this rank's layout; common.c holds what
 * both need (the config they compare, the paths, the agreement between ranks, the element copies).
 */
#ifndef MOE_CKPT_CKPT_H
#define MOE_CKPT_CKPT_H

#include "ckpt/state.h"

typedef struct moe_ckpt_opts {
    const char *dir, *name; /* validated by the entry point */
    moe_comm *comm;         /* NULL: this rank alone */
    int32_t flags;
} moe_ckpt_opts;

int32_t moe_ckpt_save(moe_layer *L, const moe_ckpt_opts *o);
int32_t moe_ckpt_load(moe_layer *L, const moe_ckpt_opts *o);

/* ---- common.c */
/* The layer config fields a checkpoint must match, as compact JSON (moe_host_malloc'd), or NULL. */
char *moe_ckpt_config_json(const moe_layer *L);
/* MOE_OK when `saved` (JSON text from a checkpoint) has the layer's values; else MOE_ERR_INVALID_ARGUMENT
 * (or MOE_ERR_IO for unreadable text) with the first difference in msg. */
int32_t moe_ckpt_config_check(const moe_layer *L, const char *saved, char *msg, size_t cap);
/* The path of the index and of rank r's file; moe_host_malloc'd, or NULL. */
char *moe_ckpt_index_path(const moe_ckpt_opts *o);
char *moe_ckpt_file_name(const moe_ckpt_opts *o, const char *gen, int32_t rank, int32_t ranks);
char *moe_ckpt_join(const char *dir, const char *file);
/* Every rank passes its status; all return the same: MOE_OK when every rank's was, else the first
 * failing rank's status, with *bad = that rank (-1 when all succeeded). comm NULL: rc itself. */
int32_t moe_ckpt_agree(moe_comm *comm, int32_t rc, int32_t *bad);
/* all[k * r ..] <- rank r's v[0..k) (host memory; comm NULL: this rank's own). */
int32_t moe_ckpt_gather(moe_comm *comm, const int64_t *v, int32_t k, int64_t *all);
/* Element copies between dtypes (MOE_DTYPE_*); 1 when the change from `from` to `to` is exact. */
int moe_ckpt_exact(int32_t from, int32_t to);
void moe_ckpt_convert(const void *src, int32_t sdt, void *dst, int32_t ddt, int64_t n);
/* Copies the intersection of box `src` (src_off, src_len, holding data sp in sdt) and box `dst` (dst_off,
 * dst_len, dp in ddt), both boxes in a view of ndim <= 4 dimensions; returns the elements copied. */
int64_t moe_ckpt_copy_box(int32_t ndim, const int64_t *src_off, const int64_t *src_len, const void *sp, int32_t sdt,
                          const int64_t *dst_off, const int64_t *dst_len, void *dp, int32_t ddt);
/* Elements of the intersection of two boxes. */
int64_t moe_ckpt_overlap(int32_t ndim, const int64_t *a_off, const int64_t *a_len, const int64_t *b_off,
                         const int64_t *b_len);
size_t moe_ckpt_dtype_bytes(int32_t dtype);
/* zlib's CRC-32 of n bytes (rank_file.c). */
uint32_t moe_ckpt_crc32(const void *p, size_t n);
/* The CRC-32 of the bytes already summed into crc followed by p[0..n). */
uint32_t moe_ckpt_crc32_more(uint32_t crc, const void *p, size_t n);
/* rank_file.c: this rank's file of a save at path, its CRCs and header in meta's form; what[1] = its
 * size, what[2] = the CRC-32 of its header (the index keeps both). */
struct moe_st_header;
int32_t moe_ckpt_write_rank_file(moe_layer *L, const moe_ckpt_item *it, int32_t n, const struct moe_st_header *meta,
                                 const char *path, int64_t what[3], char *msg);

#endif /* MOE_CKPT_CKPT_H */

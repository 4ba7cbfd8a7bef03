/*
 * Saving (ckpt.h). Each rank writes "<name>-<gen>-rank<r>-of<n>.safetensors" (rank_file.c: a snapshot of
 * its state, the only time it holds the layer, written behind; temporary name, flush, rename), and the ranks agree
 * that every file is on disk; then rank 0 commits the set by renaming "<name>.index.json" into place
 * and removes the files of the generation it replaced. Until that rename the old index names the old
 * files, which nothing touched: a crash anywhere leaves the old checkpoint or the new one.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/host_alloc.h"
#include "ckpt/ckpt.h"
#include "ckpt/file_io.h"
#include "ckpt/safetensors.h"
#include "comm/comm.h"

#define MSG 512

/* The generation: rank 0's clock and pid, the same on every rank (they take rank 0's). */
static int32_t agree_generation(moe_comm *comm, char gen[24])
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t mine = (int64_t)(((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 44));
    if (comm && comm->size > 1) {
        int64_t *all = moe_host_calloc((size_t)comm->size, sizeof *all);
        if (!all) return MOE_ERR_OUT_OF_MEMORY;
        const int32_t rc = moe_ckpt_gather(comm, &mine, 1, all);
        mine = all[0];
        moe_host_free(all);
        if (rc) return rc;
    }
    snprintf(gen, 24, "%016llx", (unsigned long long)mine);
    return MOE_OK;
}

/* The file list of the index this save replaces (*out NULL when there is none, or it is not ours: its
 * files are then left alone). A read error of an existing index fails the save: the disk is failing. */
static int32_t old_files(const char *index_path, json_t **out, char *msg)
{
    char *text = NULL;
    size_t len;
    *out = NULL;
    if (access(index_path, F_OK) != 0) return MOE_OK;
    TRY(moe_file_read_all(index_path, 1u << 24, &text, &len, msg, MSG));
    json_t *o = json_loadb(text, len, 0, NULL);
    moe_host_free(text);
    json_t *files = json_incref(json_object_get(o, "files"));
    json_decref(o);
    if (json_is_array(files)) *out = files;
    else json_decref(files);
    return MOE_OK;
}

/* what: per rank {status, file size, header CRC-32} */
static int32_t write_index(const moe_ckpt_opts *o, const char *gen, int32_t ranks, const int64_t *what,
                           const char *index_path, int *renamed, char *msg)
{
    json_t *files = json_array();
    for (int32_t r = 0; files && r < ranks; r++) {
        char *fn = moe_ckpt_file_name(o, gen, r, ranks), crc[9];
        snprintf(crc, sizeof crc, "%08x", (unsigned)what[3 * r + 2]);
        json_t *f = fn ? json_pack("{s:s, s:I, s:s}", "file", fn, "bytes", (json_int_t)what[3 * r + 1],
                                   "header_crc32", crc)
                       : NULL;
        if (!f || json_array_append_new(files, f) != 0) {
            moe_host_free(fn);
            json_decref(files);
            files = NULL;
            break;
        }
        moe_host_free(fn);
    }
    json_t *idx = files ? json_pack("{s:s, s:s, s:s, s:i, s:o, s:s}", "format", MOE_ST_FORMAT, "name", o->name,
                                    "generation", gen, "ranks", ranks, "files", files, "libmoe_version",
                                    moe_st_version())
                        : NULL;
    char *text = idx ? json_dumps(idx, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(idx);
    if (!text) {
        snprintf(msg, MSG, "out of memory for the index");
        return MOE_ERR_OUT_OF_MEMORY;
    }
    moe_file_out f;
    int32_t rc = moe_file_create(&f, index_path, msg, MSG);
    if (rc == MOE_OK) rc = moe_file_write(&f, text, strlen(text), msg, MSG);
    if (rc == MOE_OK) rc = moe_file_write(&f, "\n", 1, msg, MSG);
    if (rc == MOE_OK) rc = moe_file_commit(&f, renamed, msg, MSG);
    else moe_file_abort(&f);
    free(text);
    return rc;
}


int32_t moe_ckpt_save(moe_layer *L, const moe_ckpt_opts *o)
{
    moe_context *ctx = L->ctx;
    const int32_t rank = o->comm ? o->comm->rank : 0, ranks = o->comm ? o->comm->size : 1;
    char msg[MSG] = "", gen[24] = "";
    moe_ckpt_item *it = NULL;
    char *config = NULL, *index_path = NULL, *fname = NULL, *path = NULL;
    json_t *old = NULL;
    int32_t n = 0, bad = -1, wrote = 0;
    int committed = 0;
    int64_t what[3] = {0, 0, 0}, *whats = moe_host_calloc((size_t)ranks * 3, sizeof *whats);
    if (!whats) return moe_errorf(ctx, MOE_ERR_OUT_OF_MEMORY, "moe_layer_save: out of host memory");

    int32_t rc = agree_generation(o->comm, gen);
    if (rc) {
        moe_host_free(whats);
        return moe_errorf(ctx, rc, "moe_layer_save: the ranks could not agree on a generation");
    }
    rc = moe_ckpt_items(L, o->flags, &it, &n);
    config = moe_ckpt_config_json(L);
    index_path = moe_ckpt_index_path(o);
    fname = moe_ckpt_file_name(o, gen, rank, ranks);
    path = fname ? moe_ckpt_join(o->dir, fname) : NULL;
    if (rc == MOE_OK && (!config || !index_path || !path)) rc = MOE_ERR_OUT_OF_MEMORY;
    if (rc) snprintf(msg, MSG, "out of memory");
    if (rc == MOE_OK) rc = moe_file_mkdir(o->dir, msg, MSG);
    if (rc == MOE_OK && rank == 0) rc = old_files(index_path, &old, msg);
    if (rc == MOE_OK) {
        moe_st_header meta = {.rank = rank, .ranks = ranks, .config = config};
        snprintf(meta.generation, sizeof meta.generation, "%s", gen);
        rc = moe_ckpt_write_rank_file(L, it, n, &meta, path, what, msg);
        wrote = 1; /* the new name may exist even when a flush after its rename failed */
    }
    /* every rank's file is on disk, or none is committed */
    what[0] = rc;
    int32_t all = moe_ckpt_gather(o->comm, what, 3, whats);
    for (int32_t r = 0; all == MOE_OK && r < ranks; r++)
        if (whats[3 * r] != MOE_OK) bad = r, all = (int32_t)whats[3 * r];
    if (all == MOE_OK && rank == 0) rc = write_index(o, gen, ranks, whats, index_path, &committed, msg);
    if (all == MOE_OK) { /* every rank learns whether rank 0's index moved: then the new files stay */
        const int64_t mine[3] = {rc, committed, 0};
        all = moe_ckpt_gather(o->comm, mine, 3, whats);
        committed = all == MOE_OK ? (int32_t)whats[1] : 0;
        for (int32_t r = 0; all == MOE_OK && r < ranks; r++)
            if (whats[3 * r] != MOE_OK) bad = r, all = (int32_t)whats[3 * r];
    }
    if (all != MOE_OK) {
        if (wrote && !committed) unlink(path); /* the old index never named it */
        if (rc == MOE_OK && bad >= 0)
            snprintf(msg, MSG, "rank %d of %d failed (its own error says why); the previous checkpoint is kept", bad, ranks);
        rc = all;
    } else if (rank == 0 && old) { /* the new set is committed: the replaced files go */
        size_t i;
        json_t *f;
        json_array_foreach(old, i, f) {
            const char *fn = json_string_value(json_object_get(f, "file"));
            if (!fn || strchr(fn, '/') || fn[0] == '.' || strstr(fn, gen)) continue;
            char p[4096]; /* no allocation after the commit: nothing may fail it */
            if ((size_t)snprintf(p, sizeof p, "%s/%s", o->dir, fn) < sizeof p) unlink(p);
        }
    }
    json_decref(old);
    moe_host_free(whats);
    moe_host_free(it), moe_host_free(config), moe_host_free(index_path), moe_host_free(fname);
    moe_host_free(path);
    if (rc) return moe_errorf(ctx, rc, "moe_layer_save: %s", msg);
    return MOE_OK;
}

/*
 * Loading (ckpt.h). Every rank reads the committed index and the headers of its files, matches each of
 * its entries with the pieces of the same name (any layout: the pieces of a tensor are boxes of its
 * view, one per saving rank), reads only the pieces that overlap its own box, checks their CRC-32 and
 * stages its new state in host memory. Only when every rank has staged everything do they copy it
 * into their layers: a failure anywhere leaves every layer as it was.
 */
#define _DEFAULT_SOURCE /* madvise(2) */
#include <jansson.h>
#include <pthread.h>
#include <sys/mman.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/host_alloc.h"
#include "ckpt/ckpt.h"
#include "ckpt/file_io.h"
#include "ckpt/safetensors.h"
#include "comm/comm.h"

#define MSG 768
#define READ_PIECE ((size_t)1 << 20) /* read and checksummed at once: stays in the L2 cache */
#define PREFAULT_MIN ((size_t)16 << 20)

typedef struct rank_file {
    char *path;
    uint64_t bytes;     /* the index's size of the file */
    uint32_t hdr_crc;   /* and the CRC-32 of its header (size and JSON) */
    int fd;
    uint64_t data_start;
    moe_st_header h;
} rank_file;

typedef struct load_state {
    const moe_ckpt_opts *o;
    moe_layer *L;
    char gen[24];
    int32_t ranks;
    rank_file *f;
    moe_ckpt_item *it;
    int32_t n;
    void **staged; /* per item: its new bytes in the item's dtype; NULL = zeros (reset accumulators) */
    char msg[MSG];
} load_state;

static int32_t fail(load_state *s, int32_t rc, const char *fmt, const char *a, const char *b)
{
    snprintf(s->msg, MSG, fmt, a, b);
    return rc;
}

/* The committed index: generation, rank count and the files, which must be plain names in dir. */
static int32_t read_index(load_state *s)
{
    char *path = moe_ckpt_index_path(s->o), *text = NULL;
    size_t len = 0;
    if (!path) return MOE_ERR_OUT_OF_MEMORY;
    int32_t rc = moe_file_read_all(path, 1u << 24, &text, &len, s->msg, MSG);
    json_t *o = rc ? NULL : json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL), *files = NULL;
    const char *fmt = NULL, *gen = NULL;
    json_int_t ranks = 0;
    if (rc == MOE_OK && (!o || json_unpack(o, "{s:s, s:s, s:I, s:o}", "format", &fmt, "generation", &gen, "ranks",
                                           &ranks, "files", &files) != 0 ||
                         strcmp(fmt, MOE_ST_FORMAT) != 0 || strlen(gen) >= sizeof s->gen || ranks < 1 ||
                         ranks > (1 << 20) || !json_is_array(files) || json_array_size(files) != (size_t)ranks))
        rc = fail(s, MOE_ERR_IO, "%s is not a libmoe checkpoint index (format, generation, ranks, files)%s", path, "");
    if (rc == MOE_OK) {
        snprintf(s->gen, sizeof s->gen, "%s", gen);
        s->ranks = (int32_t)ranks;
        s->f = moe_host_calloc((size_t)ranks, sizeof *s->f);
        if (!s->f) rc = MOE_ERR_OUT_OF_MEMORY;
        for (int32_t r = 0; s->f && r < s->ranks; r++) s->f[r].fd = -1;
        for (int32_t r = 0; rc == MOE_OK && r < s->ranks; r++) {
            const char *fn = NULL, *crc = NULL;
            json_int_t bytes = -1;
            if (json_unpack(json_array_get(files, (size_t)r), "{s:s, s:I, s:s}", "file", &fn, "bytes", &bytes,
                            "header_crc32", &crc) != 0 || strchr(fn, '/') || fn[0] == '.' || bytes < 8 ||
                !moe_st_hex32(crc, &s->f[r].hdr_crc))
                rc = fail(s, MOE_ERR_IO, "%s: a files entry is not {file (a name in the checkpoint's directory), "
                          "bytes, header_crc32}%s", path, "");
            else if (!(s->f[r].path = moe_ckpt_join(s->o->dir, fn)))
                rc = MOE_ERR_OUT_OF_MEMORY;
            else
                s->f[r].bytes = (uint64_t)bytes;
        }
    }
    json_decref(o);
    moe_host_free(text), moe_host_free(path);
    return rc;
}

/* Opens rank r's file and checks its header against the index and the layer. */
static int32_t read_header(load_state *s, int32_t r)
{
    rank_file *f = &s->f[r];
    uint64_t size = 0;
    unsigned char len8[8];
    char why[400];
    int32_t rc = moe_file_open(f->path, &f->fd, &size, s->msg, MSG);
    if (rc) return rc;
    moe_file_sequential(f->fd);
    if (size != f->bytes) {
        snprintf(s->msg, MSG, "%s holds %llu bytes; the index says %llu (%s)", f->path, (unsigned long long)size,
                 (unsigned long long)f->bytes, size < f->bytes ? "truncated" : "not the file that was saved");
        return MOE_ERR_IO;
    }
    TRY(moe_file_pread(f->fd, f->path, len8, 8, 0, s->msg, MSG));
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | len8[i];
    if (hl > MOE_ST_MAX_HEADER || hl > size - 8)
        return fail(s, MOE_ERR_IO, "%s: its header size exceeds the file (%s)", f->path, "damaged");
    char *hdr = moe_host_malloc((size_t)hl + 8);
    if (!hdr) return MOE_ERR_OUT_OF_MEMORY;
    memcpy(hdr, len8, 8);
    rc = moe_file_pread(f->fd, f->path, hdr + 8, (size_t)hl, 8, s->msg, MSG);
    if (rc == MOE_OK && moe_ckpt_crc32(hdr, (size_t)hl + 8) != f->hdr_crc)
        rc = fail(s, MOE_ERR_IO, "%s: its header does not match the CRC-32 the index holds: the file is %s", f->path,
                  "damaged");
    if (rc == MOE_OK) {
        rc = moe_st_header_parse(hdr + 8, (size_t)hl, size - 8 - hl, &f->h, why, sizeof why);
        if (rc) snprintf(s->msg, MSG, "%s: %s", f->path, why);
    }
    moe_host_free(hdr);
    if (rc) return rc;
    f->data_start = 8 + hl;
    if (f->h.rank != r || f->h.ranks != s->ranks || strcmp(f->h.generation, s->gen) != 0)
        return fail(s, MOE_ERR_IO, "%s does not belong to this checkpoint (its rank, rank count or generation differ "
                    "from the index)%s", f->path, "");
    rc = moe_ckpt_config_check(s->L, f->h.config, why, sizeof why);
    if (rc) snprintf(s->msg, MSG, "%s: %s", f->path, why);
    return rc;
}

static int same_box(int32_t nd, const moe_state_entry *a, const moe_state_entry *b)
{
    for (int32_t d = 0; d < nd; d++)
        if (a->offset[d] != b->offset[d] || a->length[d] != b->length[d]) return 0;
    return 1;
}

/* Reads piece p of file f (whole: its CRC covers it), checks it, and copies its overlap with item x. */
/* Reads n bytes at off into dst in 1 MiB pieces, each checksummed while in cache; *crc continues. */
static int32_t read_crc(load_state *s, const rank_file *f, char *dst, size_t n, uint64_t off, uint32_t *crc)
{
    for (size_t k = 0; k < n; k += READ_PIECE) {
        const size_t m = n - k < READ_PIECE ? n - k : READ_PIECE;
        TRY(moe_file_pread(f->fd, f->path, dst + k, m, off + k, s->msg, MSG));
        *crc = moe_ckpt_crc32_more(*crc, dst + k, m);
    }
    return MOE_OK;
}

/* Reads piece p of file f (whole: its CRC covers it), checks it, and puts its overlap with item x into
 * dst: read straight there when the piece is x's own box in x's dtype (a load onto the saved
 * layout), else through a buffer and converted. */
static int32_t read_piece(load_state *s, const rank_file *f, const moe_st_tensor *p, const moe_ckpt_item *x, void *dst)
{
    const size_t bytes = (size_t)(p->end - p->begin);
    int direct = p->e.dtype == x->e.dtype && p->e.view_ndim == x->e.view_ndim;
    for (int32_t d = 0; direct && d < x->e.view_ndim; d++)
        direct = p->e.offset[d] == x->e.offset[d] && p->e.length[d] == x->e.length[d];
    void *buf = direct ? dst : moe_host_malloc(bytes ? bytes : 1);
    if (!buf) return MOE_ERR_OUT_OF_MEMORY;
    uint32_t crc = 0;
    int32_t rc = read_crc(s, f, buf, bytes, f->data_start + p->begin, &crc);
    if (rc == MOE_OK && crc != p->crc)
        rc = fail(s, MOE_ERR_IO, "%s: tensor \"%s\" does not match its CRC-32: the file is damaged", f->path, p->e.name);
    if (rc == MOE_OK && !direct)
        moe_ckpt_copy_box(x->e.view_ndim, p->e.offset, p->e.length, buf, p->e.dtype, x->e.offset, x->e.length, dst,
                          x->e.dtype);
    if (!direct) moe_host_free(buf);
    return rc;
}

/* The page faults of a fresh staging buffer cost about as much as reading it from the disk: another
 * core takes them, while this one reads. madvise(MADV_POPULATE_WRITE) (Linux 5.14) maps the pages
 * without writing them, so it cannot overwrite what the reader put there first; where the kernel
 * lacks it, it fails and the reader takes the faults itself. */
typedef struct prefault {
    char *p;
    size_t n;
} prefault;

static void *populate(void *arg)
{
    const prefault *pf = arg;
    const uintptr_t page = 4096, a = ((uintptr_t)pf->p + page - 1) & ~(page - 1), e = (uintptr_t)pf->p + pf->n;
#ifdef MADV_POPULATE_WRITE
    if (e > a) (void)madvise((void *)a, (e - a) & ~(page - 1), MADV_POPULATE_WRITE);
#else
    (void)a, (void)e;
#endif
    return NULL;
}

static int32_t stage_pieces(load_state *s, const moe_ckpt_item *x, void *dst, int acc, int32_t my_rank);

/* Stages item i: finds its pieces, checks they fit and cover its box, reads them. */
static int32_t stage(load_state *s, int32_t i, int32_t my_rank, int32_t my_ranks)
{
    const moe_ckpt_item *x = &s->it[i];
    const moe_state_entry *e = &x->e;
    const size_t bytes = (size_t)x->numel * moe_ckpt_dtype_bytes(e->dtype);
    const int acc = e->kind == MOE_STATE_ACCUMULATOR;
    if (acc && (s->o->flags & MOE_CHECKPOINT_RESET_ACCUMULATORS)) return MOE_OK; /* staged = NULL: zeros */
    if (acc && s->ranks != my_ranks)
        return fail(s, MOE_ERR_INVALID_ARGUMENT, "\"%s\" is a per-rank accumulator saved by %s ranks; this load has "
                    "another rank count: save after moe_layer_update_expert_bias / moe_layer_reset_global_aux and load "
                    "with MOE_CHECKPOINT_RESET_ACCUMULATORS", e->name, "a different number of");
    void *dst = moe_host_malloc(bytes ? bytes : 1);
    if (!dst) return MOE_ERR_OUT_OF_MEMORY;
    s->staged[i] = dst;
    prefault pf = {dst, bytes};
    pthread_t th;
    const int touching = bytes >= PREFAULT_MIN && pthread_create(&th, NULL, populate, &pf) == 0;
    const int32_t rc = stage_pieces(s, x, dst, acc, my_rank);
    if (touching) pthread_join(th, NULL);
    return rc;
}

/* Reads the pieces of item x that overlap its box into dst. */
static int32_t stage_pieces(load_state *s, const moe_ckpt_item *x, void *dst, int acc, int32_t my_rank)
{
    const moe_state_entry *e = &x->e;
    int64_t covered = 0;
    int found = 0;
    for (int32_t r = 0; r < s->ranks; r++) {
        if (acc && r != my_rank) continue;
        const rank_file *f = &s->f[r];
        for (int32_t k = 0; k < f->h.n; k++) {
            const moe_st_tensor *p = &f->h.t[k];
            if (strcmp(p->e.name, e->name) != 0) continue;
            found = 1;
            int fits = p->e.view_ndim == e->view_ndim && p->e.kind == e->kind;
            for (int32_t d = 0; fits && d < e->view_ndim; d++) fits = p->e.view_shape[d] == e->view_shape[d];
            if (!fits)
                return fail(s, MOE_ERR_INVALID_ARGUMENT, "%s: tensor \"%s\" has another kind or global shape than this "
                            "layer's", f->path, e->name);
            if (!moe_ckpt_exact(p->e.dtype, e->dtype) &&
                (!(s->o->flags & MOE_CHECKPOINT_CAST) || p->e.dtype == MOE_DTYPE_INT64 || e->dtype == MOE_DTYPE_INT64)) {
                snprintf(s->msg, MSG, "%s: tensor \"%s\" is %s; this layer keeps %s, and that change is not exact "
                         "(pass MOE_CHECKPOINT_CAST to round)", f->path, e->name, moe_st_dtype_name(p->e.dtype),
                         moe_st_dtype_name(e->dtype));
                return MOE_ERR_INVALID_ARGUMENT;
            }
            const int64_t ov = moe_ckpt_overlap(e->view_ndim, p->e.offset, p->e.length, e->offset, e->length);
            if (ov == 0) continue; /* not this rank's: never read */
            int dup = 0; /* a data-parallel replica saved the same box: read it once */
            for (int32_t r2 = 0; r2 < r && !dup && !acc; r2++)
                for (int32_t k2 = 0; k2 < s->f[r2].h.n && !dup; k2++)
                    dup = strcmp(s->f[r2].h.t[k2].e.name, e->name) == 0 && same_box(e->view_ndim, &s->f[r2].h.t[k2].e, &p->e);
            if (dup) continue;
            TRY(read_piece(s, f, p, x, dst));
            covered += ov;
        }
    }
    if (!found)
        return fail(s, MOE_ERR_INVALID_ARGUMENT, "the checkpoint has no tensor \"%s\"%s", e->name,
                    e->kind == MOE_STATE_GRAD ? " (it was saved without MOE_CHECKPOINT_GRADS)"
                    : e->kind == MOE_STATE_COMPANION ? " (no companion of that name was attached when it was saved)" : "");
    if (covered != x->numel) {
        snprintf(s->msg, MSG, "tensor \"%s\": the checkpoint's pieces cover %lld of the %lld elements of this rank's "
                 "slice (%s)", e->name, (long long)covered, (long long)x->numel,
                 covered < x->numel ? "a rank's file lacks it" : "pieces overlap");
        return MOE_ERR_IO;
    }
    return MOE_OK;
}

/* Copies the staged state into the layer (the only part ordered with the layer's calls). */
static int32_t commit(load_state *s)
{
    moe_layer *L = s->L;
    MOE_ENTER(en, ex, L->ctx, NULL, &L->order);
    en.sync_on_exit = 1; /* host companions and the staging are read before the call returns */
    for (int32_t i = 0; i < s->n; i++) {
        const moe_ckpt_item *x = &s->it[i];
        const size_t bytes = (size_t)x->numel * moe_ckpt_dtype_bytes(x->e.dtype);
        if (!s->staged[i]) TRY(moe_mem_zero(L->ctx, &ex, x->data, bytes));
        else if (x->on_host) memcpy(x->data, s->staged[i], bytes);
        else TRY(moe_copy_to_device(L->ctx, &ex, x->data, s->staged[i], bytes));
    }
    return MOE_OK;
}

int32_t moe_ckpt_load(moe_layer *L, const moe_ckpt_opts *o)
{
    load_state s = {.o = o, .L = L};
    const int32_t rank = o->comm ? o->comm->rank : 0, ranks = o->comm ? o->comm->size : 1;
    int32_t rc = read_index(&s);
    for (int32_t r = 0; rc == MOE_OK && r < s.ranks; r++) rc = read_header(&s, r);
    if (rc == MOE_OK) rc = moe_ckpt_items(L, o->flags, &s.it, &s.n);
    if (rc == MOE_OK && !(s.staged = moe_host_calloc((size_t)(s.n ? s.n : 1), sizeof *s.staged))) rc = MOE_ERR_OUT_OF_MEMORY;
    for (int32_t i = 0; rc == MOE_OK && i < s.n; i++) rc = stage(&s, i, rank, ranks);
    if (rc == MOE_ERR_OUT_OF_MEMORY && s.msg[0] == '\0') snprintf(s.msg, MSG, "out of memory");
    int32_t bad = -1;
    const int32_t all = moe_ckpt_agree(o->comm, rc, &bad);
    if (all != MOE_OK && rc == MOE_OK)
        snprintf(s.msg, MSG, "rank %d of %d could not load the checkpoint (its own error says why); nothing was changed",
                 bad, ranks);
    rc = all;
    if (rc == MOE_OK) {
        rc = commit(&s);
        if (rc) snprintf(s.msg, MSG, "could not copy the loaded state into the layer");
    }
    for (int32_t r = 0; s.f && r < s.ranks; r++) {
        if (s.f[r].fd >= 0) close(s.f[r].fd);
        moe_host_free(s.f[r].path);
        moe_st_header_free(&s.f[r].h);
    }
    for (int32_t i = 0; s.staged && i < s.n; i++) moe_host_free(s.staged[i]);
    moe_host_free(s.staged), moe_host_free(s.f), moe_host_free(s.it);
    if (rc) return moe_errorf(L->ctx, rc, "moe_layer_load from %s/%s: %s", o->dir, o->name, s.msg);
    return MOE_OK;
}

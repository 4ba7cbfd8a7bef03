/*
 * One rank's file of a save (ckpt.h), written while its state is still being read: the items are
 * taken in 1 MiB pieces, each piece's CRC-32 computed while it is in cache, and a writer thread
 * follows behind, writing what is ready at its final offset. The header's size does not depend on
 * the CRCs (eight hex digits each), so the data's offset is known before them and the header is
 * written last, at offset 0; then the file is flushed and renamed.
 * Where the state lives on a device, the pieces are copied into one host block first and the layer
 * is free once that copy (at memory speed, not the disk's) is done. On a CPU context they are
 * written from the layer's own memory: a copy would cost a pass over the state and its page faults,
 * and buy nothing, since the call is synchronous and a context is used by one thread at a time.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "base/host_alloc.h"
#include "ckpt/ckpt.h"
#include "ckpt/file_io.h"
#include "ckpt/safetensors.h"

#define MSG 512
#define PIECE ((size_t)1 << 20)   /* copied and checksummed at once: stays in the L2 cache */
#define PUBLISH ((size_t)8 << 20) /* the writer is woken once this much more is ready */

uint32_t moe_ckpt_crc32(const void *p, size_t n) { return moe_ckpt_crc32_more(0, p, n); }

uint32_t moe_ckpt_crc32_more(uint32_t crc, const void *p, size_t n)
{
    uLong c = crc; /* zlib's crc32 of nothing is 0, so a CRC starts from 0; zlib takes uInt lengths */
    const Bytef *b = p;
    while (n > 0) {
        const uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, b, k);
        b += k, n -= k;
    }
    return (uint32_t)c;
}

typedef struct writer {
    moe_file_out *f;
    const char *const *seg; /* each item's bytes, back to back in the file */
    const size_t *seg_bytes;
    int32_t nseg;
    uint64_t data_off;
    size_t total;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t ready; /* bytes of block the snapshot has filled */
    int stop;     /* the snapshot failed: write no more */
    int32_t rc;
    char msg[MSG];
} writer;

/* Writes data bytes [from, to) of the concatenated segments. */
static int32_t write_range(writer *w, size_t from, size_t to)
{
    size_t base = 0;
    for (int32_t i = 0; i < w->nseg && from < to; i++) {
        const size_t end = base + w->seg_bytes[i];
        if (from < end) {
            const size_t upto = to < end ? to : end;
            TRY(moe_file_pwrite(w->f, w->seg[i] + (from - base), upto - from, w->data_off + from, w->msg, MSG));
            from = upto;
        }
        base = end;
    }
    return MOE_OK;
}

static void *write_behind(void *arg)
{
    writer *w = arg;
    size_t done = 0;
    while (done < w->total) {
        pthread_mutex_lock(&w->mu);
        while (w->ready == done && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        const size_t upto = w->ready;
        const int stop = w->stop;
        pthread_mutex_unlock(&w->mu);
        if (stop) break;
        w->rc = write_range(w, done, upto);
        if (w->rc) break;
        done = upto;
    }
    return NULL;
}

static void publish(writer *w, size_t ready, int stop)
{
    pthread_mutex_lock(&w->mu);
    w->ready = ready;
    w->stop |= stop;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Takes every item's CRC-32 in 1 MiB pieces and tells the writer what is ready; a device item is
 * first copied into block (seg[i] says where each item's bytes are). The only part of a save ordered
 * with the layer's calls. */
static int32_t snapshot(moe_layer *L, const moe_ckpt_item *it, int32_t n, char *block, const char *const *seg,
                        moe_st_tensor *t, writer *w)
{
    MOE_ENTER(en, ex, L->ctx, NULL, &L->order);
    size_t at = 0, told = 0;
    for (int32_t i = 0; i < n; i++) {
        const size_t bytes = (size_t)it[i].numel * moe_ckpt_dtype_bytes(it[i].e.dtype);
        const int copy = seg[i] != it[i].data;
        uLong crc = crc32(0L, Z_NULL, 0);
        for (size_t k = 0; k < bytes; k += PIECE) {
            const size_t m = bytes - k < PIECE ? bytes - k : PIECE;
            if (copy && it[i].on_host) memcpy(block + at + k, (const char *)it[i].data + k, m);
            else if (copy) TRY(moe_copy_to_host(L->ctx, &ex, block + at + k, (const char *)it[i].data + k, m));
            crc = crc32(crc, (const Bytef *)seg[i] + k, (uInt)m);
            if (w && at + k + m - told >= PUBLISH) publish(w, told = at + k + m, 0);
        }
        t[i].crc = (uint32_t)crc;
        at += bytes;
    }
    if (w) publish(w, at, 0);
    return MOE_OK;
}

int32_t moe_ckpt_write_rank_file(moe_layer *L, const moe_ckpt_item *it, int32_t n, const moe_st_header *meta,
                                 const char *path, int64_t what[3], char *msg)
{
    const int on_cpu = L->ctx->device_type == MOE_DEVICE_CPU;
    size_t total = 0, copied = 0;
    for (int32_t i = 0; i < n; i++) {
        const size_t b = (size_t)it[i].numel * moe_ckpt_dtype_bytes(it[i].e.dtype);
        total += b;
        copied += on_cpu || it[i].on_host ? 0 : b;
    }
    moe_st_tensor *t = moe_host_calloc((size_t)(n ? n : 1), sizeof *t);
    const char **seg = moe_host_calloc((size_t)(n ? n : 1), sizeof *seg);
    size_t *seg_bytes = moe_host_calloc((size_t)(n ? n : 1), sizeof *seg_bytes);
    char *block = moe_host_malloc(copied ? copied : 1), *hdr = NULL;
    size_t hlen = 0;
    uint64_t data_bytes = 0;
    int32_t rc = MOE_OK;
    if (!t || !seg || !seg_bytes || !block) {
        snprintf(msg, MSG, "out of memory for the %zu bytes of this rank's state", copied);
        rc = MOE_ERR_OUT_OF_MEMORY;
        goto done;
    }
    size_t off = 0; /* host memory is written as it is; device items go back to back into block */
    for (int32_t i = 0; i < n; i++) {
        t[i].e = it[i].e;
        seg_bytes[i] = (size_t)it[i].numel * moe_ckpt_dtype_bytes(it[i].e.dtype);
        if (on_cpu || it[i].on_host) {
            seg[i] = it[i].data;
        } else {
            seg[i] = block + off;
            off += seg_bytes[i];
        }
    }
    /* the header with CRCs still 0: its size, hence the data's offset */
    if ((rc = moe_st_header_write(t, n, meta, &hdr, &hlen, &data_bytes)) != MOE_OK) {
        snprintf(msg, MSG, "out of memory for the header of %s", path);
        goto done;
    }
    moe_host_free(hdr), hdr = NULL;
    moe_file_out f;
    if ((rc = moe_file_create(&f, path, msg, MSG)) != MOE_OK) goto done;
    writer w = {.f = &f, .seg = seg, .seg_bytes = seg_bytes, .nseg = n, .data_off = hlen, .total = total};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    pthread_t th;
    const int threaded = total > 0 && pthread_create(&th, NULL, write_behind, &w) == 0;
    rc = snapshot(L, it, n, block, seg, t, threaded ? &w : NULL); /* a device's layer is free from here */
    if (rc) snprintf(msg, MSG, "could not copy the layer's state off the device");
    if (threaded) {
        if (rc) publish(&w, w.ready, 1);
        pthread_join(th, NULL);
        if (rc == MOE_OK && w.rc != MOE_OK) rc = w.rc, snprintf(msg, MSG, "%s", w.msg);
    } else if (rc == MOE_OK) {
        rc = write_range(&w, 0, total); /* no thread: write it all now */
        if (rc) snprintf(msg, MSG, "%s", w.msg);
    }
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    size_t hlen2 = 0;
    if (rc == MOE_OK && (rc = moe_st_header_write(t, n, meta, &hdr, &hlen2, &data_bytes)) != MOE_OK)
        snprintf(msg, MSG, "out of memory for the header of %s", path);
    if (rc == MOE_OK && hlen2 != hlen) { /* cannot happen: the CRCs have a fixed width */
        snprintf(msg, MSG, "the header of %s changed size", path);
        rc = MOE_ERR_INTERNAL;
    }
    if (rc == MOE_OK) rc = moe_file_pwrite(&f, hdr, hlen, 0, msg, MSG);
    if (rc == MOE_OK) {
        what[1] = (int64_t)(hlen + data_bytes);
        what[2] = (int64_t)moe_ckpt_crc32(hdr, hlen);
        int renamed = 0;
        rc = moe_file_commit(&f, &renamed, msg, MSG); /* cleans up after itself */
    } else {
        moe_file_abort(&f);
    }
done:
    moe_host_free(hdr);
    moe_host_free(block);
    moe_host_free(seg_bytes);
    moe_host_free(seg);
    moe_host_free(t);
    return rc;
}

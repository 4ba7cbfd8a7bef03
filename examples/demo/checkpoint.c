/* The demo's checkpoints: see checkpoint.h. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RECORD_FILE "demo_state.json"
#define RECORD_FORMAT "libmoe-demo-checkpoint-1"
#define HOST_FILE "host.bin"
#define HOST_VERSION 1u
static const char host_magic[8] = {'M', 'O', 'E', 'D', 'E', 'M', 'O', '\n'};

_Noreturn static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\nerror: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void join(char *out, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        fail("checkpoint path too long: %s/%s", dir, name);
}

/* FNV-1a, 64 bits: enough to tell a damaged host.bin from a good one. */
static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Writes dir/name through dir/name.tmp: written, flushed, renamed, then the directory flushed. */
static void write_atomic(const char *dir, const char *name, const void *data, size_t size)
{
    char final[4096], tmp[4200];
    join(final, sizeof final, dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0)
        fail("cannot write %s: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = size;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            unlink(tmp);
            fail("cannot write %s: %s", tmp, strerror(e));
        }
        p += n;
        left -= (size_t)n;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        fail("cannot flush %s: %s", tmp, strerror(e));
    }
    if (close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        fail("cannot write %s: %s", tmp, strerror(e));
    }
    if (rename(tmp, final) != 0) {
        int e = errno;
        unlink(tmp);
        fail("cannot rename %s to %s: %s", tmp, final, strerror(e));
    }
    int dfd = open(dir, O_RDONLY);
    if (dfd < 0 || fsync(dfd) != 0)
        fail("cannot flush the directory %s: %s", dir, strerror(errno));
    close(dfd);
}

/* The whole file, NUL-terminated; NULL with errno set on failure. */
static char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (ferror(f)) {
            int e = errno ? errno : EIO;
            free(buf);
            fclose(f);
            errno = e;
            return NULL;
        }
        if (feof(f))
            break;
        char *grown = realloc(buf, cap * 2);
        if (!grown)
            free(buf);
        buf = grown;
        cap *= 2;
    }
    fclose(f);
    if (!buf) {
        errno = ENOMEM;
        return NULL;
    }
    buf[n] = '\0';
    *size = n;
    return buf;
}

/* ---------------------------------------------------------------- the record (demo_state.json) */

/* The record's fields, read with Jansson (Debian's libjansson, as libmoe's own checkpoints are). */
static int record_int(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return -1;
    *out = (int64_t)json_integer_value(v);
    return 0;
}

static int record_real(const json_t *o, const char *key, double *out)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_number(v))
        return -1;
    *out = json_number_value(v);
    return 0;
}

static int record_text(const json_t *o, const char *key, char *out, size_t cap)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_string(v) || strlen(json_string_value(v)) >= cap)
        return -1;
    snprintf(out, cap, "%s", json_string_value(v));
    return 0;
}

void demo_ckpt_read_record(const char *path, demo_ckpt_record *rec)
{
    char file[4096];
    join(file, sizeof file, path, RECORD_FILE);
    size_t size = 0;
    char *text = read_file(file, &size);
    if (!text)
        fail("cannot read the checkpoint %s: %s", file, strerror(errno));
    memset(rec, 0, sizeof *rec);
    char format[64] = "", rng[80] = "";
    int64_t v[12];
    static const char *const ints[12] = {"step", "steps", "layers", "experts", "top_k", "adam_steps",
                                         "expected_points", "window_start", "held_after_forward",
                                         "offloaded_after_forward", "quant_saturated", "seed"};
    const char *bad = NULL;
    double aux = 0.0;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(o) || record_text(o, "format", format, sizeof format) || strcmp(format, RECORD_FORMAT))
        bad = "format";
    for (int i = 0; i < 12 && !bad; i++)
        if (record_int(o, ints[i], 0, INT64_MAX, &v[i]) != 0)
            bad = ints[i];
    if (!bad && (record_text(o, "slot", rec->slot, sizeof rec->slot) ||
                 (strcmp(rec->slot, "slot-a") && strcmp(rec->slot, "slot-b"))))
        bad = "slot";
    if (!bad && record_real(o, "aux", &aux))
        bad = "aux";
    if (!bad && record_real(o, "loss_ema", &rec->loss_ema))
        bad = "loss_ema";
    if (!bad && record_text(o, "rng", rng, sizeof rng))
        bad = "rng";
    json_decref(o);
    for (int i = 0; i < 4 && !bad; i++) { /* four 16-digit hexadecimal words separated by spaces */
        char *end = NULL;
        const char *word = rng + 17 * i;
        errno = 0;
        rec->rng[i] = strtoull(word, &end, 16);
        if (strlen(rng) != 67 || errno || end != word + 16)
            bad = "rng";
    }
    free(text);
    if (!bad) {
        rec->step = (int)(v[0] <= 1000000 ? v[0] : -1);
        rec->steps = (int)(v[1] <= 1000000 ? v[1] : -1);
        rec->layers = (int)(v[2] <= 64 ? v[2] : -1);
        rec->experts = (int)(v[3] <= 256 ? v[3] : -1);
        rec->top_k = (int)(v[4] <= 256 ? v[4] : -1);
        rec->adam_steps = v[5];
        rec->expected_points = (int)(v[6] <= 2000000 ? v[6] : -1);
        rec->window_start = (int)(v[7] <= 1000000 ? v[7] : -1);
        rec->held_after_forward = v[8];
        rec->offloaded_after_forward = v[9];
        rec->quant_saturated = v[10];
        rec->seed = (uint64_t)v[11];
        rec->aux = (float)aux;
        if (rec->steps < 1 || rec->step < 0 || rec->step > rec->steps)
            bad = "step";
        else if (rec->layers < 1 || rec->experts < 1 || rec->top_k < 1 || rec->top_k > rec->experts)
            bad = "layers";
        else if (rec->expected_points < 1 || rec->window_start > rec->step)
            bad = "expected_points";
    }
    if (bad)
        fail("%s: not a train_demo checkpoint record (\"%s\" is missing or out of range)", file, bad);
}

static void write_record(const char *path, const demo_ckpt_record *rec)
{
    char text[2048];
    int n = snprintf(text, sizeof text,
                     "{\n"
                     "  \"format\": \"%s\",\n"
                     "  \"library\": \"libmoe %s\",\n"
                     "  \"step\": %d,\n"
                     "  \"steps\": %d,\n"
                     "  \"slot\": \"%s\",\n"
                     "  \"layers\": %d,\n"
                     "  \"experts\": %d,\n"
                     "  \"top_k\": %d,\n"
                     "  \"aux\": %.9g,\n"
                     "  \"seed\": %" PRIu64 ",\n"
                     "  \"adam_steps\": %" PRId64 ",\n"
                     "  \"rng\": \"%016" PRIx64 " %016" PRIx64 " %016" PRIx64 " %016" PRIx64 "\",\n"
                     "  \"loss_ema\": %.17g,\n"
                     "  \"loss\": %.9g,\n"
                     "  \"loss_smooth\": %.9g,\n"
                     "  \"expected_points\": %d,\n"
                     "  \"window_start\": %d,\n"
                     "  \"held_after_forward\": %" PRId64 ",\n"
                     "  \"offloaded_after_forward\": %" PRId64 ",\n"
                     "  \"quant_saturated\": %" PRId64 "\n"
                     "}\n",
                     RECORD_FORMAT, moe_version_string(), rec->step, rec->steps, rec->slot, rec->layers, rec->experts,
                     rec->top_k, (double)rec->aux, rec->seed, rec->adam_steps, rec->rng[0], rec->rng[1], rec->rng[2],
                     rec->rng[3], rec->loss_ema, rec->loss, rec->loss_smooth, rec->expected_points, rec->window_start,
                     rec->held_after_forward, rec->offloaded_after_forward, rec->quant_saturated);
    if (n < 0 || (size_t)n >= sizeof text)
        fail("the checkpoint record does not fit its buffer");
    write_atomic(path, RECORD_FILE, text, (size_t)n);
}

/* ---------------------------------------------------------------- the host's arrays (host.bin)
 * "MOEDEMO\n", u32 version, u32 count, then per array: u32 name length, the name, u64 byte count, the
 * bytes; then the FNV-1a 64 of everything before it. Integers and floats in the machine's byte order. */

static unsigned char *put(unsigned char *p, const void *data, size_t n)
{
    memcpy(p, data, n);
    return p + n;
}

static void write_arrays(const char *dir, const demo_ckpt_array *arrays, int count)
{
    size_t size = sizeof host_magic + 8 + 8;
    for (int i = 0; i < count; i++)
        size += 4 + strlen(arrays[i].name) + 8 + arrays[i].bytes;
    unsigned char *buf = demo_calloc(size, 1), *p = buf;
    const uint32_t version = HOST_VERSION, n = (uint32_t)count;
    p = put(p, host_magic, sizeof host_magic);
    p = put(p, &version, 4);
    p = put(p, &n, 4);
    for (int i = 0; i < count; i++) {
        const uint32_t len = (uint32_t)strlen(arrays[i].name);
        const uint64_t bytes = arrays[i].bytes;
        p = put(p, &len, 4);
        p = put(p, arrays[i].name, len);
        p = put(p, &bytes, 8);
        if (bytes)
            p = put(p, arrays[i].data, bytes);
    }
    const uint64_t sum = fnv1a(buf, (size_t)(p - buf));
    put(p, &sum, 8);
    write_atomic(dir, HOST_FILE, buf, size);
    free(buf);
}

static void read_arrays(const char *dir, const demo_ckpt_array *arrays, int count)
{
    char file[4096];
    join(file, sizeof file, dir, HOST_FILE);
    size_t size = 0;
    unsigned char *buf = (unsigned char *)read_file(file, &size);
    if (!buf)
        fail("cannot read %s: %s", file, strerror(errno));
    uint64_t sum = 0;
    uint32_t version = 0, n = 0;
    if (size < sizeof host_magic + 16 || memcmp(buf, host_magic, sizeof host_magic))
        fail("%s: not a train_demo host state file", file);
    memcpy(&sum, buf + size - 8, 8);
    if (sum != fnv1a(buf, size - 8))
        fail("%s: checksum mismatch (the file is damaged or truncated)", file);
    memcpy(&version, buf + 8, 4);
    memcpy(&n, buf + 12, 4);
    if (version != HOST_VERSION || n != (uint32_t)count)
        fail("%s: version %u with %u arrays; this demo reads version %u with %d", file, version, n, HOST_VERSION,
             count);
    size_t at = 16;
    const size_t end = size - 8;
    for (int i = 0; i < count; i++) {
        uint32_t len = 0;
        uint64_t bytes = 0;
        const size_t want = strlen(arrays[i].name);
        if (end - at < 4 || (memcpy(&len, buf + at, 4), len != want) || end - at - 4 < (size_t)len + 8 ||
            memcmp(buf + at + 4, arrays[i].name, want))
            fail("%s: array %d is not \"%s\"", file, i, arrays[i].name);
        at += 4 + len;
        memcpy(&bytes, buf + at, 8);
        at += 8;
        if (bytes != arrays[i].bytes || end - at < bytes)
            fail("%s: \"%s\" has %llu bytes, this run expects %zu", file, arrays[i].name, (unsigned long long)bytes,
                 arrays[i].bytes);
        if (bytes)
            memcpy(arrays[i].data, buf + at, (size_t)bytes);
        at += (size_t)bytes;
    }
    if (at != end)
        fail("%s: %zu unexpected bytes after the arrays", file, end - at);
    free(buf);
}

/* ---------------------------------------------------------------- the layers */

static void layer_config(moe_context *ctx, moe_checkpoint_config *cc, const char *dir, char *name, size_t cap, int l)
{
    demo_check(ctx, moe_checkpoint_config_init(cc, sizeof *cc), "moe_checkpoint_config_init");
    snprintf(name, cap, "layer%d", l);
    cc->dir = dir;
    cc->name = name; /* the layers share the slot's directory, each under its own name */
    cc->comm = NULL; /* one process: this rank alone */
    cc->flags = 0;   /* saved between steps: no gradients in flight */
}

void demo_ckpt_attach_moments(demo_model *m)
{
    for (int i = 0; i < m->num_params; i++) {
        demo_param *p = &m->params[i];
        if (p->layer < 0)
            continue;
        float *moments[2] = {p->m, p->v};
        static const char *const names[2] = {"exp_avg", "exp_avg_sq"};
        for (int k = 0; k < 2; k++) {
            DLTensor t; /* the parameter's local shape, over the host's array */
            memset(&t, 0, sizeof t);
            t.data = moments[k];
            t.device.device_type = kDLCPU;
            t.ndim = p->w_view->dl_tensor.ndim;
            t.shape = p->w_view->dl_tensor.shape;
            t.dtype.code = kDLFloat;
            t.dtype.bits = 32;
            t.dtype.lanes = 1;
            char what[128];
            snprintf(what, sizeof what, "moe_layer_attach_state(%s, \"%s\")", p->name, names[k]);
            demo_check(m->ctx, moe_layer_attach_state(m->layers[p->layer], p->slot, names[k], &t), what);
        }
    }
}

void demo_ckpt_prepare(const char *path)
{
    struct stat st;
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        fail("cannot create the checkpoint directory %s: %s", path, strerror(errno));
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        fail("%s is not a directory", path);
    if (access(path, W_OK | X_OK) != 0)
        fail("cannot write into the checkpoint directory %s: %s", path, strerror(errno));
}

void demo_ckpt_save(demo_model *m, const char *path, demo_ckpt_record *rec, const demo_ckpt_array *arrays,
                    int count)
{
    demo_ckpt_prepare(path);

    /* the slot the current record (if any) does not name */
    char file[4096], current[16] = "";
    join(file, sizeof file, path, RECORD_FILE);
    size_t size = 0;
    char *text = read_file(file, &size);
    json_t *o = text ? json_loads(text, 0, NULL) : NULL;
    if (!o || record_text(o, "slot", current, sizeof current) != 0)
        current[0] = '\0';
    json_decref(o);
    free(text);
    snprintf(rec->slot, sizeof rec->slot, "%s", strcmp(current, "slot-a") ? "slot-a" : "slot-b");

    char dir[4096];
    join(dir, sizeof dir, path, rec->slot);
    for (int l = 0; l < m->cfg.layers; l++) {
        moe_checkpoint_config cc;
        char name[24], what[4200];
        layer_config(m->ctx, &cc, dir, name, sizeof name, l);
        snprintf(what, sizeof what, "moe_layer_save(%s, \"%s\")", dir, name);
        demo_check(m->ctx, moe_layer_save(m->layers[l], &cc), what);
    }
    write_arrays(dir, arrays, count);
    write_record(path, rec); /* the commit */
}

void demo_ckpt_load(demo_model *m, const char *path, const demo_ckpt_record *rec, const demo_ckpt_array *arrays,
                    int count)
{
    char dir[4096];
    join(dir, sizeof dir, path, rec->slot);
    for (int l = 0; l < m->cfg.layers; l++) {
        moe_checkpoint_config cc;
        char name[24], what[4200];
        layer_config(m->ctx, &cc, dir, name, sizeof name, l);
        snprintf(what, sizeof what, "moe_layer_load(%s, \"%s\")", dir, name);
        demo_check(m->ctx, moe_layer_load(m->layers[l], &cc), what);
    }
    read_arrays(dir, arrays, count);
}

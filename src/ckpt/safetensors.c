/* The safetensors container (safetensors.h). */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/host_alloc.h"
#include "ckpt/safetensors.h"

#define MAX_TENSORS 4096

#define STR_(x) #x
#define STR(x) STR_(x)
const char *moe_st_version(void)
{
    return STR(MOE_VERSION_MAJOR) "." STR(MOE_VERSION_MINOR) "." STR(MOE_VERSION_PATCH);
}

const char *moe_st_dtype_name(int32_t dtype)
{
    switch (dtype) {
    case MOE_DTYPE_FP32: return "F32";
    case MOE_DTYPE_BF16: return "BF16";
    case MOE_DTYPE_FP64: return "F64";
    case MOE_DTYPE_INT64: return "I64";
    default: return NULL;
    }
}

static int32_t dtype_of(const char *s)
{
    const int32_t all[4] = {MOE_DTYPE_FP32, MOE_DTYPE_BF16, MOE_DTYPE_FP64, MOE_DTYPE_INT64};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, moe_st_dtype_name(all[i])) == 0) return all[i];
    return -1;
}

int moe_st_hex32(const char *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 8; i++) {
        const char c = s[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0; /* also the terminator of a shorter string */
        v = v << 4 | (uint32_t)d;
    }
    if (s[8] != '\0') return 0;
    *out = v;
    return 1;
}

static uint64_t dtype_bytes(int32_t dt) { return dt == MOE_DTYPE_BF16 ? 2 : dt == MOE_DTYPE_FP32 ? 4 : 8; }

/* ------------------------------------------------------------------------------- writing */

static json_t *int_array(const int64_t *v, int32_t n)
{
    json_t *a = json_array();
    for (int32_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* The libmoe description of one tensor, as the JSON text the format's string-only metadata holds. */
static char *tensor_meta(const moe_st_tensor *t)
{
    const moe_state_entry *e = &t->e;
    char crc[9];
    snprintf(crc, sizeof crc, "%08" PRIx32, t->crc);
    json_t *o = json_pack("{s:i, s:i, s:o, s:o, s:o, s:s}", "kind", e->kind, "slot", e->slot, "shape",
                          int_array(e->shape, e->ndim), "view", int_array(e->view_shape, e->view_ndim), "offset",
                          int_array(e->offset, e->view_ndim), "crc32", crc);
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

int32_t moe_st_header_write(moe_st_tensor *t, int32_t n, const moe_st_header *meta, char **out, size_t *len,
                            uint64_t *data_bytes)
{
    int32_t rc = MOE_ERR_OUT_OF_MEMORY;
    char *text = NULL, num[24];
    json_t *root = json_object(), *md = json_object();
    if (!root || !md) goto done;
    uint64_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        const moe_state_entry *e = &t[i].e;
        uint64_t bytes = dtype_bytes(e->dtype);
        for (int32_t d = 0; d < e->view_ndim; d++) bytes *= (uint64_t)e->length[d];
        t[i].begin = at, t[i].end = at + bytes;
        at += bytes;
        json_t *ti = json_pack("{s:s, s:o, s:[I,I]}", "dtype", moe_st_dtype_name(e->dtype), "shape",
                               int_array(e->length, e->view_ndim), "data_offsets", (json_int_t)t[i].begin,
                               (json_int_t)t[i].end);
        if (!ti || json_object_set_new(root, e->name, ti) != 0) goto done;
        char key[128], *m = tensor_meta(&t[i]);
        snprintf(key, sizeof key, "libmoe.tensor.%s", e->name);
        if (!m) goto done;
        const int bad = json_object_set_new(md, key, json_string(m)) != 0;
        free(m);
        if (bad) goto done;
    }
    if (json_object_set_new(md, "libmoe.format", json_string(MOE_ST_FORMAT)) != 0) goto done;
    snprintf(num, sizeof num, "%d", meta->rank);
    if (json_object_set_new(md, "libmoe.rank", json_string(num)) != 0) goto done;
    snprintf(num, sizeof num, "%d", meta->ranks);
    if (json_object_set_new(md, "libmoe.ranks", json_string(num)) != 0) goto done;
    if (json_object_set_new(md, "libmoe.generation", json_string(meta->generation)) != 0) goto done;
    if (json_object_set_new(md, "libmoe.version", json_string(moe_st_version())) != 0) goto done;
    if (json_object_set_new(md, "libmoe.config", json_string(meta->config)) != 0) goto done;
    if (json_object_set_new(root, "__metadata__", md) != 0) {
        md = NULL;
        goto done;
    }
    md = NULL;
    text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text) goto done;
    const size_t tl = strlen(text), padded = (tl + 7) & ~(size_t)7; /* data starts 8-byte aligned */
    char *buf = moe_host_malloc(8 + padded);
    if (!buf) goto done;
    for (int i = 0; i < 8; i++) buf[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
    memcpy(buf + 8, text, tl);
    memset(buf + 8 + tl, ' ', padded - tl);
    *out = buf, *len = 8 + padded, *data_bytes = at;
    rc = MOE_OK;
done:
    free(text);
    json_decref(md);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------------- parsing */

#define FAIL(...)                                                                                            \
    do {                                                                                                     \
        snprintf(msg, cap, __VA_ARGS__);                                                                     \
        goto done;                                                                                           \
    } while (0)

/* An array of 1..4 non-negative integers (0..4 when may_be_empty) into v; returns its length or -1. */
static int32_t dims_of(const json_t *a, int64_t *v, int may_be_empty)
{
    if (!json_is_array(a)) return -1;
    const size_t n = json_array_size(a);
    if (n > 4 || (n == 0 && !may_be_empty)) return -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > ((json_int_t)1 << 48))
            return -1;
        v[i] = (int64_t)json_integer_value(x);
    }
    return (int32_t)n;
}

static int int_string(const json_t *s, int64_t lo, int64_t hi, int32_t *out)
{
    if (!json_is_string(s)) return 0;
    char *end = NULL;
    const char *p = json_string_value(s);
    long long v = strtoll(p, &end, 10);
    if (end == p || *end != '\0' || v < lo || v > hi) return 0;
    *out = (int32_t)v;
    return 1;
}

/* The libmoe description of tensor t (its safetensors dtype, shape and offsets already read). */
static int parse_meta(const char *text, moe_st_tensor *t, char *why, size_t cap)
{
    int ok = 0;
    json_error_t err;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    int64_t shape[4], view[4], off[4];
    json_int_t kind = -1, slot = -2;
    const char *crc = NULL;
    json_t *js = NULL, *jv = NULL, *jo = NULL;
    if (!o || json_unpack(o, "{s:I, s:I, s:o, s:o, s:o, s:s}", "kind", &kind, "slot", &slot, "shape", &js, "view",
                          &jv, "offset", &jo, "crc32", &crc) != 0) {
        snprintf(why, cap, "its libmoe description is not the expected object");
        goto done;
    }
    moe_state_entry *e = &t->e;
    const int32_t nd = dims_of(js, shape, 0), vn = dims_of(jv, view, 0), on = dims_of(jo, off, 0);
    if (kind < MOE_STATE_PARAM || kind > MOE_STATE_COMPANION || slot < -1 || slot >= MOE_PARAM_NUM_SLOTS || nd < 0 ||
        vn < 0 || on != vn || vn != e->view_ndim) {
        snprintf(why, cap, "its libmoe description has a bad kind, slot, shape, view or offset");
        goto done;
    }
    if (!moe_st_hex32(crc, &t->crc)) {
        snprintf(why, cap, "its crc32 \"%s\" is not 8 hex digits", crc);
        goto done;
    }
    uint64_t gn = 1, vnum = 1;
    int wrap = 0; /* dims < 2^48, but four of them overflow 64 bits: a wrapped product may compare equal */
    for (int32_t d = 0; d < nd; d++) wrap |= __builtin_mul_overflow(gn, (uint64_t)shape[d], &gn);
    for (int32_t d = 0; d < vn; d++) {
        wrap |= __builtin_mul_overflow(vnum, (uint64_t)view[d], &vnum);
        /* length (the safetensors shape) was read into e->length */
        if (off[d] > view[d] || e->length[d] > view[d] - off[d]) {
            snprintf(why, cap, "its box leaves the view in dimension %d", d);
            goto done;
        }
    }
    if (wrap || gn != vnum) {
        snprintf(why, cap, "its view does not hold the global shape's elements");
        goto done;
    }
    e->kind = (int32_t)kind, e->slot = (int32_t)slot, e->ndim = nd;
    memcpy(e->shape, shape, sizeof shape), memcpy(e->view_shape, view, sizeof view), memcpy(e->offset, off, sizeof off);
    ok = 1;
done:
    json_decref(o);
    return ok;
}

static int by_begin(const void *x, const void *y)
{
    const moe_st_tensor *a = x, *b = y;
    return (a->begin > b->begin) - (a->begin < b->begin);
}

int32_t moe_st_header_parse(const char *hdr, size_t len, uint64_t data_bytes, moe_st_header *h, char *msg,
                            size_t cap)
{
    int32_t rc = MOE_ERR_IO;
    json_error_t err;
    moe_st_header r = {0};
    json_t *root = json_loadb(hdr, len, JSON_REJECT_DUPLICATES, &err), *md = NULL;
    if (!root || !json_is_object(root)) FAIL("the header is not a JSON object (%s)", root ? "other value" : err.text);
    md = json_object_get(root, "__metadata__");
    if (!json_is_object(md)) FAIL("the header has no __metadata__ object: not a libmoe checkpoint");
    const json_t *fmt = json_object_get(md, "libmoe.format"), *gen = json_object_get(md, "libmoe.generation"),
                 *cfg = json_object_get(md, "libmoe.config");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), MOE_ST_FORMAT) != 0)
        FAIL("__metadata__.libmoe.format is not \"%s\"", MOE_ST_FORMAT);
    if (!int_string(json_object_get(md, "libmoe.ranks"), 1, 1 << 20, &r.ranks) ||
        !int_string(json_object_get(md, "libmoe.rank"), 0, r.ranks - 1, &r.rank))
        FAIL("__metadata__ has no valid libmoe.rank / libmoe.ranks");
    if (!json_is_string(gen) || strlen(json_string_value(gen)) >= sizeof r.generation)
        FAIL("__metadata__ has no valid libmoe.generation");
    snprintf(r.generation, sizeof r.generation, "%s", json_string_value(gen));
    if (!json_is_string(cfg)) FAIL("__metadata__ has no libmoe.config");
    const size_t n = json_object_size(root) - 1;
    if (n > MAX_TENSORS) FAIL("the header lists %zu tensors (at most %d)", n, MAX_TENSORS);
    r.config = moe_host_malloc(strlen(json_string_value(cfg)) + 1);
    r.t = moe_host_calloc(n ? n : 1, sizeof *r.t);
    if (!r.config || !r.t) {
        rc = MOE_ERR_OUT_OF_MEMORY;
        FAIL("out of memory");
    }
    strcpy(r.config, json_string_value(cfg));
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        moe_st_tensor *t = &r.t[r.n];
        const char *dt = NULL;
        json_t *shape = NULL;
        json_int_t b = -1, e = -1;
        if (strlen(key) >= sizeof t->e.name) FAIL("tensor name \"%.40s...\" is too long", key);
        if (!json_is_object(val) || json_unpack(val, "{s:s, s:o, s:[II]}", "dtype", &dt, "shape", &shape,
                                                "data_offsets", &b, &e) != 0)
            FAIL("tensor \"%s\" lacks dtype, shape or data_offsets", key);
        snprintf(t->e.name, sizeof t->e.name, "%s", key);
        t->e.struct_size = sizeof t->e;
        if ((t->e.dtype = dtype_of(dt)) < 0) FAIL("tensor \"%s\" has dtype %s (libmoe writes F32, BF16, F64, I64)", key, dt);
        if ((t->e.view_ndim = dims_of(shape, t->e.length, 1)) < 1) FAIL("tensor \"%s\" has a bad shape", key);
        uint64_t bytes = dtype_bytes(t->e.dtype);
        int wrap = 0; /* dims < 2^48, but four of them overflow 64 bits (a wrapped size may match the offsets) */
        for (int32_t d = 0; d < t->e.view_ndim; d++) wrap |= __builtin_mul_overflow(bytes, (uint64_t)t->e.length[d], &bytes);
        if (wrap) FAIL("tensor \"%s\" has a shape of 2^64 bytes or more", key);
        if (b < 0 || e < b || (uint64_t)e > data_bytes || (uint64_t)(e - b) != bytes)
            FAIL("tensor \"%s\": data_offsets [%lld, %lld] do not hold its %" PRIu64 " bytes within the %" PRIu64
                 " of the file", key, (long long)b, (long long)e, bytes, data_bytes);
        t->begin = (uint64_t)b, t->end = (uint64_t)e;
        char mkey[128], why[160];
        snprintf(mkey, sizeof mkey, "libmoe.tensor.%s", key);
        const json_t *m = json_object_get(md, mkey);
        if (!json_is_string(m)) FAIL("tensor \"%s\" has no libmoe description in __metadata__", key);
        if (!parse_meta(json_string_value(m), t, why, sizeof why)) FAIL("tensor \"%s\": %s", key, why);
        r.n++;
    }
    /* the format's rule: the tensors fill the data section, no gaps, no overlaps */
    qsort(r.t, (size_t)r.n, sizeof *r.t, by_begin);
    uint64_t at = 0;
    for (int32_t i = 0; i < r.n; i++) {
        if (r.t[i].begin != at) FAIL("tensor \"%s\" starts at byte %" PRIu64 ", expected %" PRIu64, r.t[i].e.name, r.t[i].begin, at);
        at = r.t[i].end;
    }
    if (at != data_bytes) FAIL("the tensors end at byte %" PRIu64 " of a %" PRIu64 "-byte data section", at, data_bytes);
    *h = r;
    r = (moe_st_header){0};
    rc = MOE_OK;
done:
    moe_st_header_free(&r);
    json_decref(root);
    return rc;
}

void moe_st_header_free(moe_st_header *h)
{
    moe_host_free(h->config);
    moe_host_free(h->t);
    *h = (moe_st_header){0};
}

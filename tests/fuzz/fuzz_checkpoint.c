/*
 * fuzz_checkpoint: the safetensors header parser of the checkpoints (src/ckpt/safetensors.h), and
 * moe_layer_load over whole fuzzed files.
 *
 * Input: 8 bytes of control word C (little-endian; missing bytes read as 0), then the payload.
 *   mode = C >> 56 (its top byte), data_bytes = C & (2^56 - 1).
 *   mode bit 7 clear: parse mode. The payload is the header's JSON (what a file holds after its 8-byte
 *     size), parsed with moe_st_header_parse(payload, its length, data_bytes, ...).
 *       bits 0-1: injected host allocation failure during the parse (0 none, 1 the first allocation,
 *                 2 the second, 3 the first and every later one);
 *       bits 2-3: the capacity of the message buffer (160, 400, 16 or 1 bytes, a heap block of exactly
 *                 that size).
 *   mode bit 7 set: load mode (data_bytes unused). The payload is a whole rank file (8-byte header size,
 *     JSON, data). The harness writes it and an index naming it (rank 0 of 1, the file's size and the
 *     CRC-32 of its header, the generation its header claims when it parses) into a private temporary
 *     directory and calls moe_layer_load on a small fp32 layer (H = F = E = 2, SwiGLU, expert bias).
 *       bit 0: the index's header CRC-32 is wrong; bit 1: the index's size is one byte more than the
 *       file's (both must fail); bit 4: MOE_CHECKPOINT_CAST; bit 5: MOE_CHECKPOINT_RESET_ACCUMULATORS;
 *       bit 6: MOE_CHECKPOINT_GRADS.
 *
 * Parse mode checks: no crash, no leak (moe_host_live and LeakSanitizer; the header is freed on
 * success); a failure returns MOE_ERR_IO (MOE_ERR_OUT_OF_MEMORY exactly when an injected failure
 * fired), leaves *h untouched and writes a NUL-terminated, non-empty message within cap. A success is
 * self-consistent: 0 <= rank < ranks, NUL-terminated strings, every tensor's dtype / kind / slot / ndim
 * in range, its box inside its view, its view holding exactly the global shape's elements, its bytes
 * [begin, end) inside data_bytes and exactly its shape's bytes, names unique, and the tensors, sorted,
 * covering [0, data_bytes) back to back. And it round-trips: moe_st_header_write of what was parsed
 * gives a header that parses to the same thing.
 * Load mode checks: the status is MOE_OK, MOE_ERR_IO, MOE_ERR_INVALID_ARGUMENT or MOE_ERR_OUT_OF_MEMORY,
 * an error's message begins with its name, a wrong index (bits 0-1) always fails; a failed load leaves
 * every parameter of the layer as it was; no host allocation and no file descriptor leaks. The
 * directory (<TMPDIR or /tmp>/libmoe-fuzz-checkpoint.<pid>) holds at most two files, removed after every
 * input, and is itself removed at exit; a crash (which skips the exit) leaves it, and the next run
 * removes the directories of dead processes.
 *
 * Seeds: FZ_CKPT_WRITE_SEEDS=<dir> build-fuzz/tests/fuzz/fuzz_checkpoint writes valid seeds of both
 * modes into <dir> (from moe_layer_save of this harness's layer, with and without gradients, and of a
 * bf16 layer with a gated shared expert) and exits. FZ_DEBUG=1 prints each input's status and message.
 */
#include "fuzz_common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/host_alloc.h"
#include "ckpt/safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);

static int debug_on(void)
{
    static int on = -1;
    if (on < 0) on = getenv("FZ_DEBUG") != NULL;
    return on;
}

static uint64_t le64(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < 8; i++) v |= (uint64_t)(i < n ? p[i] : 0) << (8 * i);
    return v;
}

/* ---------------------------------------------------------------- exact products (up to 256 bits) */
__extension__ typedef unsigned __int128 u128;
typedef struct big {
    uint64_t w[4];
} big;

static big big_prod(uint64_t unit, const int64_t *v, int32_t n)
{
    big b = {{unit, 0, 0, 0}};
    for (int32_t d = 0; d < n; d++) {
        u128 carry = 0;
        for (int i = 0; i < 4; i++) {
            const u128 p = (u128)b.w[i] * (uint64_t)v[d] + carry;
            b.w[i] = (uint64_t)p;
            carry = p >> 64;
        }
        FZ_CHECK(carry == 0, "a product of at most 4 dimensions below 2^63 exceeds 256 bits");
    }
    return b;
}
static int big_eq(big a, big b) { return memcmp(a.w, b.w, sizeof a.w) == 0; }
static int big_is(big a, uint64_t v) { return a.w[0] == v && a.w[1] == 0 && a.w[2] == 0 && a.w[3] == 0; }

/* ---------------------------------------------------------------- the parsed header's promises */
static int by_range(const void *x, const void *y)
{
    const moe_st_tensor *a = x, *b = y;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    return (a->end > b->end) - (a->end < b->end);
}

static uint64_t elem_bytes(int32_t dt) { return dt == MOE_DTYPE_BF16 ? 2 : dt == MOE_DTYPE_FP32 ? 4 : 8; }

static void check_header(const moe_st_header *h, uint64_t data_bytes)
{
    FZ_CHECK(h->ranks >= 1 && h->ranks <= (1 << 20) && h->rank >= 0 && h->rank < h->ranks, "rank %d of %d", h->rank,
             h->ranks);
    FZ_CHECK(memchr(h->generation, '\0', sizeof h->generation) != NULL, "generation not NUL-terminated");
    FZ_CHECK(h->config != NULL, "no config text");
    (void)strlen(h->config); /* ASan: NUL-terminated inside its block */
    FZ_CHECK(h->n >= 0 && h->n <= 4096, "%d tensors", h->n);
    FZ_CHECK(h->n == 0 || h->t != NULL, "%d tensors, t NULL", h->n);
    for (int32_t i = 0; i < h->n; i++) {
        const moe_st_tensor *t = &h->t[i];
        const moe_state_entry *e = &t->e;
        FZ_CHECK(memchr(e->name, '\0', sizeof e->name) != NULL, "tensor %d: name not NUL-terminated", i);
        FZ_CHECK(e->struct_size == sizeof *e, "\"%s\": struct_size %u", e->name, e->struct_size);
        FZ_CHECK(moe_st_dtype_name(e->dtype) != NULL, "\"%s\": dtype %d", e->name, e->dtype);
        FZ_CHECK(e->kind >= MOE_STATE_PARAM && e->kind <= MOE_STATE_COMPANION, "\"%s\": kind %d", e->name, e->kind);
        FZ_CHECK(e->slot >= -1 && e->slot < MOE_PARAM_NUM_SLOTS, "\"%s\": slot %d", e->name, e->slot);
        FZ_CHECK(e->ndim >= 1 && e->ndim <= 4 && e->view_ndim >= 1 && e->view_ndim <= 4, "\"%s\": ndim %d, view %d",
                 e->name, e->ndim, e->view_ndim);
        for (int32_t d = 0; d < e->ndim; d++) FZ_CHECK(e->shape[d] >= 0, "\"%s\": shape[%d] %lld", e->name, d, (long long)e->shape[d]);
        for (int32_t d = 0; d < e->view_ndim; d++) {
            const int64_t o = e->offset[d], l = e->length[d], v = e->view_shape[d];
            FZ_CHECK(o >= 0 && l >= 0 && v >= 0 && o <= v && l <= v - o,
                     "\"%s\": box [%lld, +%lld) leaves the view's %lld in dimension %d", e->name, (long long)o,
                     (long long)l, (long long)v, d);
        }
        FZ_CHECK(big_eq(big_prod(1, e->shape, e->ndim), big_prod(1, e->view_shape, e->view_ndim)),
                 "\"%s\": the view does not hold exactly the global shape's elements", e->name);
        FZ_CHECK(t->begin <= t->end && t->end <= data_bytes, "\"%s\": bytes [%llu, %llu) of %llu", e->name,
                 (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)data_bytes);
        FZ_CHECK(big_is(big_prod(elem_bytes(e->dtype), e->length, e->view_ndim), t->end - t->begin),
                 "\"%s\": %llu bytes for its shape", e->name, (unsigned long long)(t->end - t->begin));
        for (int32_t j = 0; j < i; j++)
            FZ_CHECK(strcmp(h->t[j].e.name, e->name) != 0, "tensor \"%s\" twice", e->name);
    }
    moe_st_tensor *s = malloc(sizeof *s * (size_t)(h->n ? h->n : 1));
    if (h->n) memcpy(s, h->t, sizeof *s * (size_t)h->n);
    qsort(s, (size_t)h->n, sizeof *s, by_range);
    uint64_t at = 0;
    for (int32_t i = 0; i < h->n; i++) {
        FZ_CHECK(s[i].begin == at, "\"%s\" starts at %llu, the previous tensor ends at %llu", s[i].e.name,
                 (unsigned long long)s[i].begin, (unsigned long long)at);
        at = s[i].end;
    }
    FZ_CHECK(at == data_bytes, "the tensors cover %llu of %llu bytes", (unsigned long long)at,
             (unsigned long long)data_bytes);
    free(s);
}

static void check_same(const moe_st_header *a, const moe_st_header *b)
{
    FZ_CHECK(a->rank == b->rank && a->ranks == b->ranks, "round trip: rank");
    FZ_CHECK(strcmp(a->generation, b->generation) == 0, "round trip: generation");
    FZ_CHECK(strcmp(a->config, b->config) == 0, "round trip: config");
    FZ_CHECK(a->n == b->n, "round trip: %d tensors, then %d", a->n, b->n);
    for (int32_t i = 0; i < a->n; i++) {
        const moe_st_tensor *x = &a->t[i], *y = NULL;
        for (int32_t j = 0; j < b->n && !y; j++)
            if (strcmp(b->t[j].e.name, x->e.name) == 0) y = &b->t[j];
        FZ_CHECK(y != NULL, "round trip: \"%s\" lost", x->e.name);
        const moe_state_entry *p = &x->e, *q = &y->e;
        int same = x->begin == y->begin && x->end == y->end && x->crc == y->crc && p->kind == q->kind &&
                   p->slot == q->slot && p->dtype == q->dtype && p->ndim == q->ndim && p->view_ndim == q->view_ndim;
        for (int32_t d = 0; same && d < p->ndim; d++) same = p->shape[d] == q->shape[d];
        for (int32_t d = 0; same && d < p->view_ndim; d++)
            same = p->view_shape[d] == q->view_shape[d] && p->offset[d] == q->offset[d] && p->length[d] == q->length[d];
        FZ_CHECK(same, "round trip: \"%s\" changed", x->e.name);
    }
}

/* moe_st_header_write of what was parsed (in data order, so every tensor keeps its bytes), parsed again. */
static void round_trip(const moe_st_header *h, uint64_t data_bytes)
{
    moe_st_tensor *t = malloc(sizeof *t * (size_t)(h->n ? h->n : 1));
    if (h->n) memcpy(t, h->t, sizeof *t * (size_t)h->n);
    qsort(t, (size_t)h->n, sizeof *t, by_range);
    char *out = NULL;
    size_t len = 0;
    uint64_t db = 0;
    int32_t st = moe_st_header_write(t, h->n, h, &out, &len, &db);
    FZ_CHECK(st == MOE_OK, "moe_st_header_write of a parsed header: %d", st);
    FZ_CHECK(db == data_bytes, "moe_st_header_write: %llu data bytes, parsed with %llu", (unsigned long long)db,
             (unsigned long long)data_bytes);
    FZ_CHECK(len >= 8 && (len - 8) % 8 == 0 && le64((const uint8_t *)out, 8) == len - 8,
             "moe_st_header_write: %zu bytes, size field %llu", len, (unsigned long long)le64((const uint8_t *)out, 8));
    for (int32_t i = 0; i < h->n; i++) {
        const moe_st_tensor *s = NULL;
        for (int32_t j = 0; j < h->n && !s; j++)
            if (strcmp(h->t[j].e.name, t[i].e.name) == 0) s = &h->t[j];
        FZ_CHECK(s && s->begin == t[i].begin && s->end == t[i].end, "moe_st_header_write moved \"%s\"", t[i].e.name);
    }
    moe_st_header h2;
    char msg[400];
    st = moe_st_header_parse(out + 8, len - 8, db, &h2, msg, sizeof msg);
    FZ_CHECK(st == MOE_OK, "the written header of a parsed one does not parse: %s", msg);
    check_same(h, &h2);
    moe_st_header_free(&h2);
    moe_host_free(out);
    free(t);
}

static void run_parse(const uint8_t *json, size_t len, uint64_t data_bytes, uint8_t mode)
{
    static const size_t caps[] = {160, 400, 16, 1};
    const size_t cap = caps[(mode >> 2) & 3];
    const int fault = mode & 3;
    char *msg = malloc(cap);
    memset(msg, 0xa5, cap);
    moe_st_header h, before;
    memset(&h, 0xa5, sizeof h);
    before = h;
    const int64_t live = moe_host_live();
    if (fault) moe_fault_host_arm(fault == 2 ? 2 : 1, fault == 3);
    /* len 0: a valid pointer all the same (libFuzzer's data may be NULL for an empty input) */
    int32_t st = moe_st_header_parse(len ? (const char *)json : "", len, data_bytes, &h, msg, cap);
    const int fired = fault ? moe_fault_host_fired() : 0;
    if (fault) moe_fault_host_arm(0, 0);
    if (debug_on())
        fprintf(stderr, "parse (%zu bytes, data_bytes %llu, fault %d): %s%s%.*s\n", len, (unsigned long long)data_bytes,
                fault, moe_status_name(st), st ? ": " : "", st ? (int)strnlen(msg, cap) : 0, msg);
    if (st == MOE_OK) {
        FZ_CHECK(!fired, "an injected allocation failure fired, yet the parse succeeded");
        check_header(&h, data_bytes);
        round_trip(&h, data_bytes);
        moe_st_header_free(&h);
        FZ_CHECK(h.config == NULL && h.t == NULL && h.n == 0, "moe_st_header_free left pointers");
    } else {
        FZ_CHECK(st == MOE_ERR_IO || st == MOE_ERR_OUT_OF_MEMORY, "moe_st_header_parse returned %d", st);
        FZ_CHECK((st == MOE_ERR_OUT_OF_MEMORY) == (fired != 0), "status %s with an injected failure %s",
                 moe_status_name(st), fired ? "fired" : "not fired");
        FZ_CHECK(memcmp(&h, &before, sizeof h) == 0, "a failed parse wrote *h");
        FZ_CHECK(memchr(msg, '\0', cap) != NULL, "the message is not NUL-terminated within %zu bytes", cap);
        FZ_CHECK(cap == 1 || msg[0] != '\0', "a failed parse left no message");
    }
    FZ_CHECK(moe_host_live() == live, "%lld host allocations leaked", (long long)(moe_host_live() - live));
    free(msg);
}

/* ---------------------------------------------------------------- load mode */
static const moe_layer_config *layer_config(void)
{
    static moe_layer_config c;
    if (c.struct_size == 0) {
        FZ_CHECK(moe_layer_config_init(&c, sizeof c) == MOE_OK, "moe_layer_config_init");
        c.hidden_size = 2;
        c.ffn_hidden_size = 2;
        c.num_experts = 2;
        c.top_k = 1;
        c.activation = MOE_ACT_SWIGLU;
        c.score_function = MOE_SCORE_SIGMOID;
        c.expert_bias = 1;
        c.param_dtype = MOE_DTYPE_FP32;
        c.seed = 7;
    }
    return &c;
}

static struct {
    fz_alloc alloc;
    moe_context *ctx;
    moe_layer *layer;
    struct {
        void *data, *copy;
        size_t bytes;
    } param[MOE_PARAM_NUM_SLOTS];
    char dir[512];
    int have_dir;
} G;

static void make_layer(void)
{
    if (G.layer) return;
    G.ctx = fz_context(&G.alloc, (size_t)64 << 20);
    int32_t st = moe_layer_create(G.ctx, layer_config(), &G.layer);
    FZ_CHECK(st == MOE_OK, "moe_layer_create: %d", st);
    for (int32_t s = 0; s < MOE_PARAM_NUM_SLOTS; s++) {
        if (moe_layer_has_param(G.layer, s) != 1) continue;
        DLManagedTensor *m = NULL;
        FZ_CHECK(moe_layer_param(G.layer, s, &m) == MOE_OK, "moe_layer_param %d", s);
        size_t n = (size_t)(m->dl_tensor.dtype.bits / 8);
        for (int32_t d = 0; d < m->dl_tensor.ndim; d++) n *= (size_t)m->dl_tensor.shape[d];
        G.param[s].data = (char *)m->dl_tensor.data + m->dl_tensor.byte_offset; /* CPU: host memory */
        G.param[s].bytes = n;
        G.param[s].copy = malloc(n ? n : 1);
        m->deleter(m); /* the layer owns the storage */
    }
}

#define DIR_PREFIX "libmoe-fuzz-checkpoint."
static const char *const FILES[] = {"fz.index.json", "f.safetensors"};

static const char *tmp_base(void)
{
    const char *t = getenv("TMPDIR");
    return t && t[0] ? t : "/tmp";
}

static void remove_dir(const char *dir)
{
    char p[600];
    for (size_t i = 0; i < sizeof FILES / sizeof FILES[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, FILES[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void remove_own_dir(void)
{
    if (G.have_dir) remove_dir(G.dir);
    G.have_dir = 0;
}

/* <tmp>/libmoe-fuzz-checkpoint.<pid>; the directories of processes that died (crashed) before removing
 * theirs are removed first. */
static void make_dir(void)
{
    if (G.have_dir) return;
    const char *base = tmp_base();
    DIR *d = opendir(base);
    for (struct dirent *de = d ? readdir(d) : NULL; de; de = readdir(d)) {
        if (strncmp(de->d_name, DIR_PREFIX, strlen(DIR_PREFIX)) != 0) continue;
        char *end = NULL;
        const long pid = strtol(de->d_name + strlen(DIR_PREFIX), &end, 10);
        if (pid <= 0 || *end != '\0' || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char p[600];
        snprintf(p, sizeof p, "%s/%s", base, de->d_name);
        remove_dir(p);
    }
    if (d) closedir(d);
    snprintf(G.dir, sizeof G.dir, "%s/" DIR_PREFIX "%ld", base, (long)getpid());
    if (mkdir(G.dir, 0700) != 0 && errno != EEXIST) FZ_CHECK(0, "mkdir %s: %s", G.dir, strerror(errno));
    G.have_dir = 1;
    atexit(remove_own_dir);
}

static void write_file(const char *name, const void *p, size_t n)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", G.dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FZ_CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
    FZ_CHECK(n == 0 || write(fd, p, n) == (ssize_t)n, "write %s", path);
    close(fd);
}

/* open(2) returns the lowest free descriptor: a descriptor leaked since the last probe takes it */
static int lowest_free_fd(void)
{
    const int fd = open("/dev/null", O_RDONLY);
    if (fd >= 0) close(fd);
    return fd;
}

static void run_load(const uint8_t *file, size_t size, uint8_t mode)
{
    make_layer();
    make_dir();
    /* the index a save would have written for this file */
    const uint64_t hl = le64(file, size);
    const int hl_ok = size >= 8 && hl <= size - 8;
    uint32_t crc = hl_ok ? (uint32_t)crc32(0L, file, (uInt)(8 + hl)) : 0;
    char gen[24] = "0";
    if (hl_ok) {
        moe_st_header h;
        char msg[16];
        if (moe_st_header_parse((const char *)file + 8, (size_t)hl, size - 8 - hl, &h, msg, sizeof msg) == MOE_OK) {
            snprintf(gen, sizeof gen, "%s", h.generation);
            moe_st_header_free(&h);
        }
    }
    if (mode & 1) crc ^= 0x10u;
    char index[512];
    snprintf(index, sizeof index,
             "{\"format\": \"%s\", \"generation\": \"%s\", \"ranks\": 1, \"files\": [{\"file\": \"%s\", \"bytes\": "
             "%zu, \"header_crc32\": \"%08x\"}]}\n",
             MOE_ST_FORMAT, gen, FILES[1], size + ((mode & 2) ? 1 : 0), (unsigned)crc);
    write_file(FILES[0], index, strlen(index));
    write_file(FILES[1], file, size);

    moe_checkpoint_config cfg;
    FZ_CHECK(moe_checkpoint_config_init(&cfg, sizeof cfg) == MOE_OK, "moe_checkpoint_config_init");
    cfg.dir = G.dir;
    cfg.name = "fz";
    cfg.flags = ((mode & 0x10) ? MOE_CHECKPOINT_CAST : 0) | ((mode & 0x20) ? MOE_CHECKPOINT_RESET_ACCUMULATORS : 0) |
                ((mode & 0x40) ? MOE_CHECKPOINT_GRADS : 0);
    for (int32_t s = 0; s < MOE_PARAM_NUM_SLOTS; s++)
        if (G.param[s].data) memcpy(G.param[s].copy, G.param[s].data, G.param[s].bytes);
    const int64_t live = moe_host_live();
    const int fd_free = lowest_free_fd();
    int32_t st = moe_layer_load(G.layer, &cfg);
    FZ_CHECK(lowest_free_fd() == fd_free, "moe_layer_load left a file descriptor open");
    for (size_t i = 0; i < sizeof FILES / sizeof FILES[0]; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", G.dir, FILES[i]);
        unlink(p);
    }
    if (debug_on()) {
        char msg[512];
        moe_context_last_error(G.ctx, msg, sizeof msg);
        fprintf(stderr, "load (%zu bytes, flags %d): %s\n", size, cfg.flags, st ? msg : "MOE_OK");
    }
    FZ_CHECK(st == MOE_OK || st == MOE_ERR_IO || st == MOE_ERR_INVALID_ARGUMENT || st == MOE_ERR_OUT_OF_MEMORY,
             "moe_layer_load returned %d", st);
    fz_check_message(G.ctx, st, "moe_layer_load");
    if (mode & 3) FZ_CHECK(st != MOE_OK, "moe_layer_load accepted a file its index does not describe");
    if (st != MOE_OK)
        for (int32_t s = 0; s < MOE_PARAM_NUM_SLOTS; s++)
            FZ_CHECK(!G.param[s].data || memcmp(G.param[s].copy, G.param[s].data, G.param[s].bytes) == 0,
                     "a failed moe_layer_load changed parameter slot %d", s);
    FZ_CHECK(moe_host_live() == live, "moe_layer_load leaked %lld host allocations", (long long)(moe_host_live() - live));
}

/* ---------------------------------------------------------------- seeds */
static void seed_out(const char *dir, const char *name, uint64_t c, const void *p, size_t n)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    FZ_CHECK(f != NULL, "fopen %s: %s", path, strerror(errno));
    uint8_t cw[8];
    for (int i = 0; i < 8; i++) cw[i] = (uint8_t)(c >> (8 * i));
    FZ_CHECK(fwrite(cw, 1, 8, f) == 8 && fwrite(p, 1, n, f) == n, "fwrite %s", path);
    fclose(f);
    printf("%s: %zu bytes\n", path, n + 8);
}

/* Saves `layer` (flags) into a fresh directory and writes the seeds of its rank file. */
static void seeds_of(const char *out, moe_layer *layer, int32_t flags, const char *tag, int load_too)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/" DIR_PREFIX "seed.%ld", tmp_base(), (long)getpid());
    moe_checkpoint_config cfg;
    moe_checkpoint_config_init(&cfg, sizeof cfg);
    cfg.dir = dir;
    cfg.name = "seed";
    cfg.flags = flags;
    FZ_CHECK(moe_layer_save(layer, &cfg) == MOE_OK, "moe_layer_save");
    DIR *d = opendir(dir);
    FZ_CHECK(d != NULL, "opendir %s", dir);
    for (struct dirent *de = readdir(d); de; de = readdir(d)) {
        char p[1100];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        const size_t nl = strlen(de->d_name);
        if (nl > 12 && strcmp(de->d_name + nl - 12, ".safetensors") == 0) {
            FILE *f = fopen(p, "rb");
            FZ_CHECK(f != NULL, "fopen %s", p);
            static uint8_t buf[1 << 16];
            const size_t n = fread(buf, 1, sizeof buf, f);
            fclose(f);
            const uint64_t hl = le64(buf, n);
            FZ_CHECK(n >= 8 && hl <= n - 8, "%s: header size", p);
            char name[64];
            snprintf(name, sizeof name, "valid-header-%s", tag);
            seed_out(out, name, n - 8 - hl, buf + 8, (size_t)hl);
            if (load_too) {
                const uint64_t mode = 0x80u | ((flags & MOE_CHECKPOINT_GRADS) ? 0x40u : 0);
                snprintf(name, sizeof name, "valid-file-%s", tag);
                seed_out(out, name, mode << 56, buf, n);
            }
        }
        if (de->d_name[0] != '.') unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void write_seeds(const char *out)
{
    make_layer();
    seeds_of(out, G.layer, 0, "fp32", 1);
    seeds_of(out, G.layer, MOE_CHECKPOINT_GRADS, "fp32-grads", 1);
    moe_layer_config c = *layer_config();
    c.param_dtype = MOE_DTYPE_BF16;
    c.expert_bias = 0;
    c.score_function = MOE_SCORE_SOFTMAX_PRE_TOPK;
    c.shared_ffn_hidden_size = 2;
    c.shared_gate = 1;
    moe_layer *l = NULL;
    char msg[256];
    const int32_t st = moe_layer_create(G.ctx, &c, &l);
    moe_context_last_error(G.ctx, msg, sizeof msg);
    FZ_CHECK(st == MOE_OK, "moe_layer_create (bf16): %s", msg);
    seeds_of(out, l, 0, "bf16-shared", 0);
    moe_layer_destroy(l);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *seeds = getenv("FZ_CKPT_WRITE_SEEDS");
    if (seeds) {
        write_seeds(seeds);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint64_t c = le64(data, size);
    const uint8_t mode = (uint8_t)(c >> 56);
    const uint8_t *payload = size > 8 ? data + 8 : NULL;
    const size_t n = size > 8 ? size - 8 : 0;
    if (mode & 0x80) run_load(payload ? payload : (const uint8_t *)"", n, mode);
    else run_parse(payload, n, c & (((uint64_t)1 << 56) - 1), mode);
    return 0;
}

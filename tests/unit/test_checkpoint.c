/*
 * Checkpoints on one rank (abi/moe.h "checkpoints"): the state dictionary's names and geometry, save
 * and load round trips (parameters, gradients, accumulators, companions), a resumed run equal bitwise
 * to the uninterrupted one, the dtype rules, and every refusal (another config, a flipped byte, a
 * truncated or missing file, injected write and read errors), each leaving the layer as it was and
 * the previous checkpoint loadable. Multi-rank resharding: tests/mpi/test_checkpoint_ep.c.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/host_alloc.h"
#include "ckpt/file_io.h"
#include "layerutil.h"

enum { H = 8, F = 3, E = 4, K = 2, FS = 5, T = 16 };

static moe_layer_config config(int32_t dtype, uint64_t seed)
{
    moe_layer_config c = lu_config(H, F, E, K); /* SwiGLU: FC1 holds 2F rows */
    c.score_function = MOE_SCORE_SIGMOID;
    c.expert_bias = 1;
    c.aux_loss_type = MOE_AUX_GLOBAL;
    c.aux_loss_coeff = 0.01f;
    c.shared_ffn_hidden_size = FS;
    c.shared_gate = 1;
    c.param_dtype = dtype;
    c.seed = seed;
    return c;
}

static size_t dt_size(int32_t dt) { return dt == MOE_DTYPE_FP64 ? 8 : dt == MOE_DTYPE_BF16 ? 2 : 4; }

static char *make_dir(void)
{
    char *d = strdup("/tmp/moe_ckpt_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d));
    return d;
}

static void remove_dir(char *d)
{
    DIR *dir = opendir(d);
    struct dirent *e;
    while (dir && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", d, e->d_name);
        unlink(p);
    }
    if (dir) closedir(dir);
    rmdir(d);
    free(d);
}

static int count_files(const char *d, const char *suffix)
{
    DIR *dir = opendir(d);
    struct dirent *e;
    int n = 0;
    while (dir && (e = readdir(dir)) != NULL) {
        size_t l = strlen(e->d_name), s = strlen(suffix);
        n += l >= s && strcmp(e->d_name + l - s, suffix) == 0;
    }
    if (dir) closedir(dir);
    return n;
}

/* Every parameter and gradient byte plus the accumulators, as the layer holds them now. */
typedef struct image {
    unsigned char *p;
    size_t n;
} image;

static image capture(lu_layer *l)
{
    image im = {NULL, 0};
    for (int32_t s = 0; s < MOE_PARAM_NUM_SLOTS; s++)
        for (int g = 0; g < 2; g++) {
            if (!moe_layer_has_param(l->layer, s) || (g && s == MOE_PARAM_EXPERT_BIAS)) continue;
            DLManagedTensor *m = NULL;
            ck_assert_int_eq(g ? moe_layer_grad(l->layer, s, &m) : moe_layer_param(l->layer, s, &m), MOE_OK);
            size_t bytes = m->dl_tensor.dtype.bits / 8;
            for (int d = 0; d < m->dl_tensor.ndim; d++) bytes *= (size_t)m->dl_tensor.shape[d];
            im.p = realloc(im.p, im.n + bytes);
            memcpy(im.p + im.n, m->dl_tensor.data, bytes);
            im.n += bytes;
            m->deleter(m);
        }
    int64_t counts[E], shape[1] = {E};
    tu_tensor tc;
    tu_tensor_make(&tc, counts, kDLInt, 64, 1, shape);
    ck_assert_int_eq(moe_layer_expert_counts(l->layer, &tc.t), MOE_OK);
    im.p = realloc(im.p, im.n + sizeof counts);
    memcpy(im.p + im.n, counts, sizeof counts);
    im.n += sizeof counts;
    return im;
}

static int same(image a, image b) { return a.n == b.n && memcmp(a.p, b.p, a.n) == 0; }

/* One training step on fixed inputs (seeded by `step`); y is written to out (T*H elements, layer dtype). */
static void train_step(lu_layer *l, int step, void *out)
{
    const int32_t dt = l->cfg.param_dtype;
    double xd[T * H], dyd[T * H];
    tu_fill_uniform_d(xd, T * H, 100 + (uint64_t)step, -1, 1);
    tu_fill_uniform_d(dyd, T * H, 200 + (uint64_t)step, -1, 1);
    unsigned char x[T * H * 8], dy[T * H * 8], dx[T * H * 8];
    for (int i = 0; i < T * H; i++) {
        if (dt == MOE_DTYPE_FP64) ((double *)x)[i] = xd[i], ((double *)dy)[i] = dyd[i];
        else if (dt == MOE_DTYPE_FP32) ((float *)x)[i] = (float)xd[i], ((float *)dy)[i] = (float)dyd[i];
        else {
            float fx = (float)xd[i], fd = (float)dyd[i];
            uint32_t ux, ud;
            memcpy(&ux, &fx, 4), memcpy(&ud, &fd, 4);
            ((uint16_t *)x)[i] = (uint16_t)(ux >> 16), ((uint16_t *)dy)[i] = (uint16_t)(ud >> 16);
        }
    }
    moe_step *s = lu_forward(l, MOE_STEP_TRAIN, x, out, T);
    int64_t shape[2] = {T, H};
    tu_tensor tdy, tdx;
    const uint8_t code = dt == MOE_DTYPE_BF16 ? kDLBfloat : kDLFloat, bits = (uint8_t)(dt_size(dt) * 8);
    tu_tensor_make(&tdy, dy, code, bits, 2, shape);
    tu_tensor_make(&tdx, dx, code, bits, 2, shape);
    ck_assert_msg(moe_layer_backward(l->layer, s, &tdy.t, &tdx.t, NULL) == MOE_OK, "%s", lu_last_error(l));
    moe_step_destroy(s);
}

static moe_checkpoint_config ckpt_config(const char *dir, int32_t flags)
{
    moe_checkpoint_config c;
    ck_assert_int_eq(moe_checkpoint_config_init(&c, sizeof c), MOE_OK);
    c.dir = dir;
    c.flags = flags;
    return c;
}

static int32_t save(lu_layer *l, const char *dir, int32_t flags)
{
    moe_checkpoint_config c = ckpt_config(dir, flags);
    return moe_layer_save(l->layer, &c);
}

static int32_t load(lu_layer *l, const char *dir, int32_t flags)
{
    moe_checkpoint_config c = ckpt_config(dir, flags);
    return moe_layer_load(l->layer, &c);
}

/* The one rank file of dir's checkpoint. */
static void rank_file(const char *dir, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    out[0] = 0;
    while (d && (e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".safetensors") && !strstr(e->d_name, ".tmp")) snprintf(out, cap, "%s/%s", dir, e->d_name);
    if (d) closedir(d);
    ck_assert_msg(out[0] != 0, "no rank file in %s", dir);
}

START_TEST(state_dictionary_names_and_geometry)
{
    lu_layer l;
    moe_layer_config c = config(MOE_DTYPE_BF16, 1);
    lu_create(&l, &c, 1);
    int32_t n = 0, ng = 0;
    ck_assert_int_eq(moe_layer_state_count(l.layer, 0, &n), MOE_OK);
    ck_assert_int_eq(moe_layer_state_count(l.layer, MOE_CHECKPOINT_GRADS, &ng), MOE_OK);
    /* 7 parameters, 2 accumulators; 6 gradients (the expert bias has none) */
    ck_assert_int_eq(n, 9);
    ck_assert_int_eq(ng, 15);
    static const char *const names[15] = {
        "router.weight", "experts.fc1.weight", "experts.fc2.weight", "shared.fc1.weight", "shared.fc2.weight",
        "shared.gate.weight", "router.expert_bias", "router.weight.grad", "experts.fc1.weight.grad",
        "experts.fc2.weight.grad", "shared.fc1.weight.grad", "shared.fc2.weight.grad", "shared.gate.weight.grad",
        "router.expert_bias.counts", "router.aux_global.state"};
    for (int32_t i = 0; i < ng; i++) {
        moe_state_entry e;
        ck_assert_int_eq(moe_state_entry_init(&e, sizeof e), MOE_OK);
        ck_assert_int_eq(moe_layer_state_entry(l.layer, MOE_CHECKPOINT_GRADS, i, &e), MOE_OK);
        ck_assert_str_eq(e.name, names[i]);
        ck_assert_uint_eq(e.struct_size, sizeof e);
        for (int d = 0; d < e.view_ndim; d++) {
            ck_assert_int_eq(e.offset[d], 0); /* one rank holds everything */
            ck_assert_int_eq(e.length[d], e.view_shape[d]);
        }
        if (strcmp(e.name, "experts.fc1.weight") == 0) {
            ck_assert_int_eq(e.kind, MOE_STATE_PARAM);
            ck_assert_int_eq(e.dtype, MOE_DTYPE_BF16);
            ck_assert_int_eq(e.ndim, 3);
            ck_assert_int_eq(e.shape[0], E);
            ck_assert_int_eq(e.shape[1], 2 * F);
            ck_assert_int_eq(e.shape[2], H);
            ck_assert_int_eq(e.view_ndim, 4); /* gated: [E, 2, F, H] */
            ck_assert_int_eq(e.view_shape[1], 2);
            ck_assert_int_eq(e.view_shape[2], F);
        }
        if (strcmp(e.name, "experts.fc2.weight.grad") == 0) {
            ck_assert_int_eq(e.kind, MOE_STATE_GRAD);
            ck_assert_int_eq(e.dtype, MOE_DTYPE_FP32); /* main grads of a bf16 layer */
        }
        if (strcmp(e.name, "router.aux_global.state") == 0) {
            ck_assert_int_eq(e.kind, MOE_STATE_ACCUMULATOR);
            ck_assert_int_eq(e.shape[0], E + 2);
        }
    }
    moe_state_entry e;
    moe_state_entry_init(&e, sizeof e);
    ck_assert_int_eq(moe_layer_state_entry(l.layer, 0, n, &e), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(lu_last_error(&l), "index"));
    ck_assert_int_eq(moe_layer_state_count(l.layer, 8, &n), MOE_ERR_INVALID_ARGUMENT);
    lu_destroy(&l);
}
END_TEST

START_TEST(round_trip_is_bitwise)
{
    static const int32_t dts[3] = {MOE_DTYPE_FP32, MOE_DTYPE_BF16, MOE_DTYPE_FP64};
    const int32_t dt = dts[_i];
    char *dir = make_dir();
    lu_layer a, b;
    moe_layer_config ca = config(dt, 1), cb = config(dt, 2);
    lu_create(&a, &ca, 2);
    lu_create(&b, &cb, 2);
    unsigned char y[T * H * 8];
    train_step(&a, 0, y); /* gradients, expert counts and the global aux state are non-zero now */
    ck_assert_msg(save(&a, dir, MOE_CHECKPOINT_GRADS) == MOE_OK, "%s", lu_last_error(&a));
    ck_assert_int_eq(count_files(dir, ".safetensors"), 1);
    ck_assert_int_eq(count_files(dir, ".index.json"), 1);
    image ia = capture(&a), ib = capture(&b);
    ck_assert(!same(ia, ib));
    ck_assert_msg(load(&b, dir, MOE_CHECKPOINT_GRADS) == MOE_OK, "%s", lu_last_error(&b));
    image ib2 = capture(&b);
    ck_assert(same(ia, ib2));
    free(ia.p), free(ib.p), free(ib2.p);
    lu_destroy(&a);
    lu_destroy(&b);
    remove_dir(dir);
}
END_TEST

/* Train N steps, save, train M more; a fresh layer loads and trains the same M: equal bitwise. */
START_TEST(resume_is_exact)
{
    char *dir = make_dir();
    lu_layer a, b;
    moe_layer_config ca = config(MOE_DTYPE_FP32, 1), cb = config(MOE_DTYPE_FP32, 7);
    lu_create(&a, &ca, 2);
    lu_create(&b, &cb, 2);
    float ya[T * H], yb[T * H];
    for (int s = 0; s < 2; s++) train_step(&a, s, ya);
    ck_assert_int_eq(save(&a, dir, MOE_CHECKPOINT_GRADS), MOE_OK);
    ck_assert_int_eq(load(&b, dir, MOE_CHECKPOINT_GRADS), MOE_OK);
    for (int s = 2; s < 4; s++) {
        train_step(&a, s, ya);
        train_step(&b, s, yb);
        ck_assert_mem_eq(ya, yb, sizeof ya);
        ck_assert_int_eq(moe_layer_update_expert_bias(a.layer, NULL), MOE_OK);
        ck_assert_int_eq(moe_layer_update_expert_bias(b.layer, NULL), MOE_OK);
    }
    image ia = capture(&a), ib = capture(&b);
    ck_assert(same(ia, ib));
    free(ia.p), free(ib.p);
    lu_destroy(&a);
    lu_destroy(&b);
    remove_dir(dir);
}
END_TEST

START_TEST(dtype_changes_exact_or_asked_for)
{
    char *dir = make_dir(), *dir2 = make_dir();
    lu_layer b16, f32, f64;
    moe_layer_config c16 = config(MOE_DTYPE_BF16, 1), c32 = config(MOE_DTYPE_FP32, 2), c64 = config(MOE_DTYPE_FP64, 3);
    lu_create(&b16, &c16, 1);
    lu_create(&f32, &c32, 1);
    lu_create(&f64, &c64, 1);
    ck_assert_int_eq(save(&b16, dir, 0), MOE_OK);
    /* bf16 -> fp32: exact */
    ck_assert_msg(load(&f32, dir, 0) == MOE_OK, "%s", lu_last_error(&f32));
    int64_t n = 0;
    const uint16_t *w16 = lu_param_ptr(&b16, MOE_PARAM_EXPERT_FC1, 0, &n);
    const float *w32 = lu_param_ptr(&f32, MOE_PARAM_EXPERT_FC1, 0, NULL);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &w32[i], 4);
        ck_assert_uint_eq(u, (uint32_t)w16[i] << 16);
    }
    /* fp64 -> fp32 narrows: refused without CAST, the layer untouched; with CAST it loads */
    ck_assert_int_eq(save(&f64, dir2, 0), MOE_OK);
    image before = capture(&f32);
    ck_assert_int_eq(load(&f32, dir2, 0), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(lu_last_error(&f32), "MOE_CHECKPOINT_CAST"));
    image after = capture(&f32);
    ck_assert(same(before, after));
    ck_assert_int_eq(load(&f32, dir2, MOE_CHECKPOINT_CAST), MOE_OK);
    const double *w64 = lu_param_ptr(&f64, MOE_PARAM_EXPERT_FC2, 0, &n);
    w32 = lu_param_ptr(&f32, MOE_PARAM_EXPERT_FC2, 0, NULL);
    for (int64_t i = 0; i < n; i++) ck_assert(w32[i] == (float)w64[i]);
    free(before.p), free(after.p);
    lu_destroy(&b16), lu_destroy(&f32), lu_destroy(&f64);
    remove_dir(dir), remove_dir(dir2);
}
END_TEST

START_TEST(another_config_is_refused)
{
    char *dir = make_dir();
    lu_layer a, b;
    moe_layer_config ca = config(MOE_DTYPE_FP32, 1), cb = config(MOE_DTYPE_FP32, 2);
    cb.top_k = 1;
    lu_create(&a, &ca, 1);
    lu_create(&b, &cb, 1);
    ck_assert_int_eq(save(&a, dir, 0), MOE_OK);
    image before = capture(&b);
    ck_assert_int_eq(load(&b, dir, 0), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(lu_last_error(&b), "top_k = 2") != NULL, "%s", lu_last_error(&b));
    image after = capture(&b);
    ck_assert(same(before, after));
    free(before.p), free(after.p);
    lu_destroy(&a), lu_destroy(&b);
    remove_dir(dir);
}
END_TEST

/* A flipped data byte, a flipped header byte, a truncated file, a missing file: MOE_ERR_IO naming the
 * file, the layer untouched. */
START_TEST(damaged_files_are_refused)
{
    char *dir = make_dir();
    lu_layer a, b;
    moe_layer_config ca = config(MOE_DTYPE_FP32, 1), cb = config(MOE_DTYPE_FP32, 2);
    lu_create(&a, &ca, 1);
    lu_create(&b, &cb, 1);
    ck_assert_int_eq(save(&a, dir, 0), MOE_OK);
    char path[600];
    rank_file(dir, path, sizeof path);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    image before = capture(&b);
    const char *want[4] = {"tensor \"router.aux_global.state\" does not match its CRC-32", "header does not match", "truncated", "cannot open"};
    for (int c = 0; c < 4; c++) {
        FILE *f = fopen(path, "r+b");
        ck_assert_ptr_nonnull(f);
        unsigned char byte;
        const long at = c == 0 ? (long)st.st_size - 5 : 40; /* a weight byte / inside the JSON header */
        if (c < 2) {
            fseek(f, at, SEEK_SET), byte = (unsigned char)fgetc(f);
            fseek(f, at, SEEK_SET), fputc(byte ^ (c == 0 ? 0x10 : 0x7f), f);
        }
        fclose(f);
        if (c == 2) ck_assert_int_eq(truncate(path, st.st_size - 3), 0);
        char saved[640];
        if (c == 3) {
            snprintf(saved, sizeof saved, "%s.away", path);
            ck_assert_int_eq(rename(path, saved), 0);
        }
        const int32_t st_load = load(&b, dir, 0);
        ck_assert_msg(st_load == MOE_ERR_IO, "case %d: load returned %d", c, st_load);
        const char *msg = lu_last_error(&b);
        ck_assert_msg(strstr(msg, path) != NULL && strstr(msg, want[c]) != NULL, "case %d: %s", c, msg);
        image after = capture(&b);
        ck_assert(same(before, after));
        free(after.p);
        /* restore the file for the next case */
        if (c == 3) {
            ck_assert_int_eq(rename(saved, path), 0);
        } else {
            ck_assert_int_eq(save(&a, dir, 0), MOE_OK);
            rank_file(dir, path, sizeof path);
            ck_assert_int_eq(stat(path, &st), 0);
        }
    }
    ck_assert_int_eq(load(&b, dir, 0), MOE_OK);
    free(before.p);
    lu_destroy(&a), lu_destroy(&b);
    remove_dir(dir);
}
END_TEST

/* A second save replaces the first (its files removed); a save that fails at any write leaves the
 * first loadable and no file of its own behind; a load that fails at any read changes nothing. */
START_TEST(failed_io_keeps_the_old_checkpoint)
{
    char *dir = make_dir();
    lu_layer a, b;
    moe_layer_config ca = config(MOE_DTYPE_FP32, 1), cb = config(MOE_DTYPE_FP32, 2);
    lu_create(&a, &ca, 1);
    lu_create(&b, &cb, 1);
    ck_assert_int_eq(save(&a, dir, MOE_CHECKPOINT_GRADS), MOE_OK);
    image first = capture(&a);
    float y[T * H];
    train_step(&a, 0, y);
    ck_assert_int_eq(moe_layer_update_expert_bias(a.layer, NULL), MOE_OK);
    for (int64_t k = 1;; k++) { /* the k-th write of the save fails */
        for (int shortw = 0; shortw < 2; shortw++) {
            moe_fault_io_arm(k, shortw);
            const int32_t st = save(&a, dir, MOE_CHECKPOINT_GRADS);
            const int fired = moe_fault_io_fired();
            moe_fault_io_arm(0, 0);
            if (!fired) {
                ck_assert_int_eq(st, MOE_OK);
                goto saved;
            }
            ck_assert_int_eq(st, MOE_ERR_IO);
            ck_assert_int_eq(count_files(dir, ".safetensors"), 1);
            ck_assert_int_eq(count_files(dir, ".tmp"), 0);
            ck_assert_int_eq(load(&b, dir, MOE_CHECKPOINT_GRADS), MOE_OK); /* the first checkpoint */
            image got = capture(&b);
            ck_assert(same(got, first));
            free(got.p);
        }
    }
saved:
    ck_assert_int_eq(count_files(dir, ".safetensors"), 1); /* the first generation's file is gone */
    image second = capture(&a);
    for (int64_t k = 1;; k++) {
        moe_fault_io_arm(k, 0);
        const int32_t st = load(&b, dir, MOE_CHECKPOINT_GRADS);
        const int fired = moe_fault_io_fired();
        moe_fault_io_arm(0, 0);
        if (!fired) {
            ck_assert_int_eq(st, MOE_OK);
            break;
        }
        ck_assert_int_eq(st, MOE_ERR_IO);
        image got = capture(&b);
        ck_assert(same(got, first));
        free(got.p);
    }
    image got = capture(&b);
    ck_assert(same(got, second));
    free(got.p), free(first.p), free(second.p);
    lu_destroy(&a), lu_destroy(&b);
    remove_dir(dir);
}
END_TEST

/* Every host allocation of a save and of a load fails once, in turn (src/base/host_alloc.h's seam):
 * MOE_ERR_OUT_OF_MEMORY with a message, the previous checkpoint kept, the loading layer unchanged,
 * nothing leaked. */
START_TEST(every_allocation_fails_once)
{
    char *dir = make_dir();
    lu_layer a, b;
    moe_layer_config ca = config(MOE_DTYPE_BF16, 1), cb = config(MOE_DTYPE_BF16, 2);
    lu_create(&a, &ca, 1);
    lu_create(&b, &cb, 1);
    float m[E * H * F];
    int64_t shape[3] = {E, H, F};
    tu_tensor tm;
    tu_tensor_f32(&tm, m, 3, shape);
    tu_fill_uniform_f(m, E * H * F, 3, -1, 1);
    ck_assert_int_eq(moe_layer_attach_state(a.layer, MOE_PARAM_EXPERT_FC2, "exp_avg_sq", &tm.t), MOE_OK);
    ck_assert_int_eq(save(&a, dir, MOE_CHECKPOINT_GRADS), MOE_OK);
    image first = capture(&a);
    unsigned char y[T * H * 2];
    train_step(&a, 0, y);
    int walked[2] = {0, 0};
    for (int op = 0; op < 2; op++) /* 0: save, 1: load */
        for (int64_t k = 1;; k++) {
            image before = capture(&b);
            const int64_t live = moe_host_live();
            moe_fault_host_arm(k, 0);
            const int32_t st = op == 0 ? save(&a, dir, MOE_CHECKPOINT_GRADS) : load(&b, dir, MOE_CHECKPOINT_GRADS);
            const int fired = moe_fault_host_fired();
            moe_fault_host_arm(0, 0);
            ck_assert_msg(moe_host_live() == live, "%s, allocation %lld: %lld host blocks leaked", op ? "load" : "save",
                          (long long)k, (long long)(moe_host_live() - live));
            image after = capture(&b);
            if (!fired) {
                ck_assert_int_eq(st, MOE_OK);
                free(before.p), free(after.p);
                break;
            }
            walked[op]++;
            ck_assert_msg(st == MOE_ERR_OUT_OF_MEMORY, "%s, allocation %lld: status %d (%s)", op ? "load" : "save",
                          (long long)k, st, lu_last_error(op ? &b : &a));
            ck_assert(same(before, after));
            if (op == 0) { /* the first checkpoint is still the committed one */
                ck_assert_int_eq(count_files(dir, ".safetensors"), 1);
                ck_assert_int_eq(load(&b, dir, MOE_CHECKPOINT_GRADS), MOE_OK);
                image got = capture(&b);
                ck_assert(same(got, first));
                free(got.p);
            }
            free(before.p), free(after.p);
        }
    printf("checkpoint: save walked %d host allocations, load %d\n", walked[0], walked[1]);
    ck_assert_int_gt(walked[0], 5);
    ck_assert_int_gt(walked[1], 5);
    free(first.p);
    lu_destroy(&a), lu_destroy(&b);
    remove_dir(dir);
}
END_TEST

START_TEST(companions_follow_their_slot)
{
    char *dir = make_dir();
    lu_layer a, b;
    moe_layer_config ca = config(MOE_DTYPE_BF16, 1), cb = config(MOE_DTYPE_BF16, 2);
    lu_create(&a, &ca, 1);
    lu_create(&b, &cb, 1);
    enum { N1 = E * 2 * F * H };
    float ma[N1], mb[N1], mc[N1];
    tu_fill_uniform_f(ma, N1, 5, -1, 1);
    tu_fill_uniform_f(mb, N1, 6, -1, 1);
    int64_t shape[3] = {E, 2 * F, H};
    tu_tensor ta, tb;
    tu_tensor_f32(&ta, ma, 3, shape);
    tu_tensor_f32(&tb, mb, 3, shape);
    ck_assert_int_eq(moe_layer_attach_state(a.layer, MOE_PARAM_EXPERT_FC1, "exp_avg", &ta.t), MOE_OK);
    ck_assert_int_eq(moe_layer_attach_state(a.layer, MOE_PARAM_EXPERT_FC1, "exp_avg", &ta.t), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(moe_layer_attach_state(a.layer, MOE_PARAM_EXPERT_FC1, "no/slash", &ta.t), MOE_ERR_INVALID_ARGUMENT);
    int64_t wrong[3] = {E, F, H};
    tu_tensor tw;
    tu_tensor_f32(&tw, mc, 3, wrong);
    ck_assert_int_eq(moe_layer_attach_state(a.layer, MOE_PARAM_EXPERT_FC1, "w", &tw.t), MOE_ERR_INVALID_ARGUMENT);
    int32_t n = 0;
    ck_assert_int_eq(moe_layer_state_count(a.layer, 0, &n), MOE_OK);
    moe_state_entry e;
    moe_state_entry_init(&e, sizeof e);
    ck_assert_int_eq(moe_layer_state_entry(a.layer, 0, n - 1, &e), MOE_OK);
    ck_assert_str_eq(e.name, "experts.fc1.weight.exp_avg");
    ck_assert_int_eq(e.kind, MOE_STATE_COMPANION);
    ck_assert_int_eq(e.dtype, MOE_DTYPE_FP32);
    ck_assert_int_eq(save(&a, dir, 0), MOE_OK);
    /* b has no such companion: its load ignores it; once attached, it is loaded */
    ck_assert_int_eq(load(&b, dir, 0), MOE_OK);
    ck_assert(memcmp(ma, mb, sizeof ma) != 0);
    ck_assert_int_eq(moe_layer_attach_state(b.layer, MOE_PARAM_EXPERT_FC1, "exp_avg", &tb.t), MOE_OK);
    ck_assert_int_eq(load(&b, dir, 0), MOE_OK);
    ck_assert_mem_eq(ma, mb, sizeof ma);
    /* a companion the checkpoint lacks is an error naming it */
    ck_assert_int_eq(moe_layer_attach_state(b.layer, MOE_PARAM_EXPERT_FC2, "exp_avg_sq", &tw.t), MOE_ERR_INVALID_ARGUMENT);
    int64_t s2[3] = {E, H, F};
    tu_tensor t2;
    tu_tensor_f32(&t2, mc, 3, s2);
    ck_assert_int_eq(moe_layer_attach_state(b.layer, MOE_PARAM_EXPERT_FC2, "exp_avg_sq", &t2.t), MOE_OK);
    ck_assert_int_eq(load(&b, dir, 0), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(lu_last_error(&b), "experts.fc2.weight.exp_avg_sq"));
    ck_assert_int_eq(moe_layer_detach_state(b.layer, MOE_PARAM_EXPERT_FC2, "exp_avg_sq"), MOE_OK);
    ck_assert_int_eq(moe_layer_detach_state(b.layer, MOE_PARAM_EXPERT_FC2, "exp_avg_sq"), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(load(&b, dir, 0), MOE_OK);
    lu_destroy(&a), lu_destroy(&b);
    remove_dir(dir);
}
END_TEST

START_TEST(bad_arguments)
{
    lu_layer a;
    moe_layer_config ca = config(MOE_DTYPE_FP32, 1);
    lu_create(&a, &ca, 1);
    ck_assert_int_eq(moe_layer_save(NULL, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(moe_layer_save(a.layer, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(lu_last_error(&a), "cfg is NULL"));
    moe_checkpoint_config c = ckpt_config(NULL, 0);
    ck_assert_int_eq(moe_layer_save(a.layer, &c), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(lu_last_error(&a), "cfg->dir"));
    c.dir = "/tmp";
    c.name = "../escape";
    ck_assert_int_eq(moe_layer_save(a.layer, &c), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(lu_last_error(&a), "cfg->name"));
    c.name = NULL;
    c.flags = 64;
    ck_assert_int_eq(moe_layer_load(a.layer, &c), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(lu_last_error(&a), "cfg->flags"));
    c.flags = 0;
    c.dir = "/nonexistent/moe/checkpoint";
    ck_assert_int_eq(moe_layer_load(a.layer, &c), MOE_ERR_IO);
    ck_assert_ptr_nonnull(strstr(lu_last_error(&a), "/nonexistent/moe/checkpoint/moe.index.json"));
    ck_assert_int_eq(moe_layer_save(a.layer, &c), MOE_ERR_IO);
    lu_destroy(&a);
}
END_TEST

static Suite *checkpoint_suite(void)
{
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, state_dictionary_names_and_geometry);
    tcase_add_loop_test(tc, round_trip_is_bitwise, 0, 3);
    tcase_add_test(tc, resume_is_exact);
    tcase_add_test(tc, dtype_changes_exact_or_asked_for);
    tcase_add_test(tc, another_config_is_refused);
    tcase_add_test(tc, damaged_files_are_refused);
    tcase_add_test(tc, failed_io_keeps_the_old_checkpoint);
    tcase_add_test(tc, every_allocation_fails_once);
    tcase_add_test(tc, companions_follow_their_slot);
    tcase_add_test(tc, bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(checkpoint_suite()); }

/*
 * Communicators on one process: the self comm's semantics for every collective (zero-byte cases
 * included), the hook comm over a simulated two-rank world (the peer's contribution is computed, so
 * offsets, rank blocks and reduce_scatter's block selection are exercised) and over one rank, hook
 * failures (MOE_ERR_CALLBACK, then the comm is broken), bad arguments with messages naming them, and
 * lifetimes (destroy order, release called exactly once). MPI and NCCL: only what holds without
 * peers or a GPU (UNSUPPORTED when not built, argument checks, MPI not initialised).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "moe.h"
#include "testutil.h"

#define SENTINEL_PTR ((moe_comm *)(uintptr_t)0x5E57AB1Eu)

static moe_context *make_ctx(void)
{
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(NULL, &ctx), MOE_OK);
    return ctx;
}

static moe_comm *make_self(moe_context *ctx)
{
    moe_comm *c = NULL;
    ck_assert_int_eq(moe_comm_create_self(ctx, NULL, &c), MOE_OK);
    ck_assert_ptr_nonnull(c);
    return c;
}

/* The last error (context or thread-local) starts with the status name and mentions `word`. */
static void expect_msg(const moe_context *ctx, int32_t status, const char *word)
{
    char buf[1024];
    moe_context_last_error(ctx, buf, sizeof buf);
    ck_assert_msg(strncmp(buf, moe_status_name(status), strlen(moe_status_name(status))) == 0,
                  "message '%s' does not start with %s", buf, moe_status_name(status));
    ck_assert_msg(strstr(buf, word) != NULL, "message '%s' does not mention '%s'", buf, word);
}

/* ------------------------------------------------------------------ config and creation */
START_TEST(test_config_init_and_checks)
{
    moe_comm_config cfg;
    ck_assert_int_eq(moe_comm_config_init(&cfg, sizeof cfg), MOE_OK);
    ck_assert_uint_eq(cfg.struct_size, sizeof cfg);
    ck_assert_uint_eq(cfg.api_version, MOE_API_VERSION);
    ck_assert_int_eq(cfg.timeout_ms, 0);
    ck_assert_int_eq(moe_comm_config_init(NULL, sizeof cfg), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(moe_comm_config_init(&cfg, 4), MOE_ERR_VERSION);

    moe_context *ctx = make_ctx();
    moe_comm *out = SENTINEL_PTR;
    ck_assert_int_eq(moe_comm_create_self(NULL, NULL, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(NULL, MOE_ERR_INVALID_ARGUMENT, "ctx");
    ck_assert_int_eq(moe_comm_create_self(ctx, NULL, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "out");

    moe_comm_config_init(&cfg, sizeof cfg);
    cfg.timeout_ms = -1;
    ck_assert_int_eq(moe_comm_create_self(ctx, &cfg, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "timeout_ms");
    moe_comm_config_init(&cfg, sizeof cfg);
    cfg.reserved0 = 3;
    ck_assert_int_eq(moe_comm_create_self(ctx, &cfg, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "reserved0");
    moe_comm_config_init(&cfg, sizeof cfg);
    cfg.struct_size = 8;
    ck_assert_int_eq(moe_comm_create_self(ctx, &cfg, &out), MOE_ERR_VERSION);
    expect_msg(ctx, MOE_ERR_VERSION, "moe_comm_config.struct_size");
    moe_comm_config_init(&cfg, sizeof cfg);
    cfg.next = &cfg;
    ck_assert_int_eq(moe_comm_create_self(ctx, &cfg, &out), MOE_ERR_UNSUPPORTED);
    expect_msg(ctx, MOE_ERR_UNSUPPORTED, "next");
    /* a newer host's larger struct with a zero tail is fine; a non-zero tail is not */
    struct {
        moe_comm_config c;
        int64_t tail;
    } big;
    memset(&big, 0, sizeof big);
    moe_comm_config_init(&big.c, sizeof big);
    ck_assert_int_eq(moe_comm_create_self(ctx, &big.c, &out), MOE_OK);
    moe_comm_destroy(out);
    out = SENTINEL_PTR;
    big.tail = 1;
    ck_assert_int_eq(moe_comm_create_self(ctx, &big.c, &out), MOE_ERR_VERSION);
    ck_assert_ptr_eq(out, SENTINEL_PTR); /* nothing the caller passed is modified on failure */

    moe_comm_config_init(&cfg, sizeof cfg);
    cfg.timeout_ms = 1234;
    ck_assert_int_eq(moe_comm_create_self(ctx, &cfg, &out), MOE_OK);
    ck_assert_int_eq(out->timeout_ms, 1234);
    moe_comm_destroy(out);
    ck_assert_int_eq(moe_comm_create_self(ctx, NULL, &out), MOE_OK);
    ck_assert_int_eq(out->timeout_ms, 300000); /* the documented default */
    moe_comm_destroy(out);
    moe_comm_destroy(NULL); /* no-op */
    moe_context_destroy(ctx);
}
END_TEST

START_TEST(test_rank_size_kind)
{
    moe_context *ctx = make_ctx();
    moe_comm *c = make_self(ctx);
    int32_t v = -7;
    ck_assert_int_eq(moe_comm_rank(c, &v), MOE_OK);
    ck_assert_int_eq(v, 0);
    ck_assert_int_eq(moe_comm_size(c, &v), MOE_OK);
    ck_assert_int_eq(v, 1);
    ck_assert_int_eq(moe_comm_kind(c, &v), MOE_OK);
    ck_assert_int_eq(v, MOE_COMM_SELF);
    ck_assert_int_eq(moe_comm_rank(NULL, &v), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(NULL, MOE_ERR_INVALID_ARGUMENT, "comm");
    ck_assert_int_eq(moe_comm_size(c, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "out");
    ck_assert_int_eq(moe_comm_kind(NULL, &v), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(moe_comm_kind(c, NULL), MOE_ERR_INVALID_ARGUMENT);
    moe_comm_destroy(c);
    moe_context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------ self semantics */
START_TEST(test_self_all_to_all_v)
{
    moe_context *ctx = make_ctx();
    moe_comm *c = make_self(ctx);
    unsigned char send[16], recv[16];
    for (int i = 0; i < 16; i++) send[i] = (unsigned char)(i + 1);
    memset(recv, 0xEE, sizeof recv);
    int64_t sb[1] = {5}, so[1] = {3}, rb[1] = {5}, ro[1] = {9};
    ck_assert_int_eq(c->ops->all_to_all_v(c, send, sb, so, recv, rb, ro, NULL), MOE_OK);
    for (int i = 0; i < 16; i++) ck_assert_uint_eq(recv[i], (i >= 9 && i < 14) ? (unsigned)(i - 9 + 4) : 0xEEu);

    /* zero bytes: NULL buffers are fine */
    int64_t z[1] = {0};
    ck_assert_int_eq(c->ops->all_to_all_v(c, NULL, z, z, NULL, z, z, NULL), MOE_OK);
    /* in place (same block) */
    int64_t off0[1] = {0};
    ck_assert_int_eq(c->ops->all_to_all_v(c, send, sb, off0, send, rb, off0, NULL), MOE_OK);
    ck_assert_uint_eq(send[0], 1);

    /* non-blocking form */
    moe_comm_request *req = NULL;
    memset(recv, 0, sizeof recv);
    ck_assert_int_eq(c->ops->all_to_all_v_start(c, send, sb, so, recv, rb, ro, &req, NULL), MOE_OK);
    ck_assert_ptr_nonnull(req);
    /* test: a self exchange is complete at start; test never frees the request, wait does */
    int32_t done = 0;
    ck_assert_int_eq(c->ops->test(c, req, &done), MOE_OK);
    ck_assert_int_eq(done, 1);
    ck_assert_int_eq(c->ops->test(c, req, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(c->ops->test(c, NULL, &done), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(c->ops->wait(c, req), MOE_OK);
    ck_assert_uint_eq(recv[9], 4);
    ck_assert_int_eq(c->ops->wait(c, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "req");
    ck_assert_int_eq(c->ops->all_to_all_v_start(c, send, sb, so, recv, rb, ro, NULL, NULL), MOE_ERR_INVALID_ARGUMENT);

    /* bad arguments */
    int64_t rb4[1] = {4};
    ck_assert_int_eq(c->ops->all_to_all_v(c, send, sb, so, recv, rb4, ro, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "recv_bytes[0]");
    int64_t neg[1] = {-1};
    ck_assert_int_eq(c->ops->all_to_all_v(c, send, neg, so, recv, rb, ro, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "send_bytes[0]");
    ck_assert_int_eq(c->ops->all_to_all_v(c, send, sb, neg, recv, rb, ro, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "send_offsets[0]");
    ck_assert_int_eq(c->ops->all_to_all_v(c, NULL, sb, so, recv, rb, ro, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "send is NULL");
    ck_assert_int_eq(c->ops->all_to_all_v(c, send, sb, so, recv, NULL, ro, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "recv_bytes");
    ck_assert_int_eq(c->ops->all_to_all_v(c, send, sb, so, recv, rb, NULL, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "recv_offsets");
    int64_t huge[1] = {INT64_MAX};
    ck_assert_int_eq(c->ops->all_to_all_v(c, send, sb, huge, recv, rb, ro, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(c->broken, 0); /* argument errors do not break the comm */
    moe_comm_destroy(c);
    moe_context_destroy(ctx);
}
END_TEST

START_TEST(test_self_all_gather_v)
{
    moe_context *ctx = make_ctx();
    moe_comm *c = make_self(ctx);
    double send[3] = {1.5, -2, 7}, recv[5] = {0, 0, 0, 0, 0};
    int64_t rb[1] = {sizeof send}, ro[1] = {2 * sizeof(double)};
    ck_assert_int_eq(c->ops->all_gather_v(c, send, sizeof send, recv, rb, ro, NULL), MOE_OK);
    ck_assert(recv[0] == 0 && recv[1] == 0 && recv[2] == 1.5 && recv[3] == -2 && recv[4] == 7);
    int64_t z[1] = {0};
    ck_assert_int_eq(c->ops->all_gather_v(c, NULL, 0, NULL, z, z, NULL), MOE_OK);
    ck_assert_int_eq(c->ops->all_gather_v(c, send, 8, recv, rb, ro, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "recv_bytes[0]");
    ck_assert_int_eq(c->ops->all_gather_v(c, send, -1, recv, rb, ro, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "send_bytes");
    ck_assert_int_eq(c->ops->all_gather_v(c, NULL, 24, recv, rb, ro, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "send is NULL");
    moe_comm_destroy(c);
    moe_context_destroy(ctx);
}
END_TEST

START_TEST(test_self_reductions)
{
    moe_context *ctx = make_ctx();
    moe_comm *c = make_self(ctx);
    float f[3] = {1, 2, 3};
    double d[2] = {0.25, -4};
    int64_t l[2] = {INT64_MAX, -5};
    ck_assert_int_eq(c->ops->all_reduce(c, f, 3, MOE_DTYPE_FP32, NULL), MOE_OK);
    ck_assert(f[0] == 1 && f[1] == 2 && f[2] == 3);
    ck_assert_int_eq(c->ops->all_reduce(c, d, 2, MOE_DTYPE_FP64, NULL), MOE_OK);
    ck_assert(d[0] == 0.25 && d[1] == -4);
    ck_assert_int_eq(c->ops->all_reduce(c, l, 2, MOE_DTYPE_INT64, NULL), MOE_OK);
    ck_assert(l[0] == INT64_MAX && l[1] == -5);
    ck_assert_int_eq(c->ops->all_reduce(c, NULL, 0, MOE_DTYPE_FP32, NULL), MOE_OK);
    ck_assert_int_eq(c->ops->all_reduce(c, f, 3, MOE_DTYPE_BF16, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "dtype");
    ck_assert_int_eq(c->ops->all_reduce(c, f, -1, MOE_DTYPE_FP32, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "count");
    ck_assert_int_eq(c->ops->all_reduce(c, NULL, 3, MOE_DTYPE_FP32, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "buf");
    ck_assert_int_eq(c->ops->all_reduce(c, f, INT64_MAX / 2, MOE_DTYPE_FP64, NULL), MOE_ERR_INVALID_ARGUMENT);

    /* reduce_scatter: recv <- block 0 of send */
    double send[4] = {1, 2, 3, 4}, recv[4] = {0, 0, 0, 0};
    int64_t counts[1] = {4};
    ck_assert_int_eq(c->ops->reduce_scatter(c, send, recv, counts, MOE_DTYPE_FP64, NULL), MOE_OK);
    ck_assert(recv[0] == 1 && recv[3] == 4);
    int64_t zero[1] = {0};
    ck_assert_int_eq(c->ops->reduce_scatter(c, NULL, NULL, zero, MOE_DTYPE_FP32, NULL), MOE_OK);
    ck_assert_int_eq(c->ops->reduce_scatter(c, send, send + 1, counts, MOE_DTYPE_FP64, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "overlaps");
    ck_assert_int_eq(c->ops->reduce_scatter(c, send, recv, NULL, MOE_DTYPE_FP64, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "recv_counts");
    int64_t negc[1] = {-2};
    ck_assert_int_eq(c->ops->reduce_scatter(c, send, recv, negc, MOE_DTYPE_FP64, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "recv_counts[0]");
    ck_assert_int_eq(c->ops->reduce_scatter(c, send, recv, counts, 77, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "dtype");
    moe_comm_destroy(c);
    moe_context_destroy(ctx);
}
END_TEST

START_TEST(test_self_broadcast_barrier_split)
{
    moe_context *ctx = make_ctx();
    moe_comm *c = make_self(ctx);
    char buf[4] = "abc";
    ck_assert_int_eq(c->ops->broadcast(c, buf, 4, 0, NULL), MOE_OK);
    ck_assert_str_eq(buf, "abc");
    ck_assert_int_eq(c->ops->broadcast(c, NULL, 0, 0, NULL), MOE_OK);
    ck_assert_int_eq(c->ops->broadcast(c, buf, 4, 1, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "root");
    ck_assert_int_eq(c->ops->broadcast(c, buf, -4, 0, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "bytes");
    ck_assert_int_eq(c->ops->barrier(c), MOE_OK);

    moe_comm *sub = SENTINEL_PTR;
    ck_assert_int_eq(moe_comm_split(c, 3, 0, &sub), MOE_OK);
    ck_assert_ptr_nonnull(sub);
    ck_assert_ptr_ne(sub, SENTINEL_PTR);
    int32_t v = -1;
    moe_comm_size(sub, &v);
    ck_assert_int_eq(v, 1);
    moe_comm_kind(sub, &v);
    ck_assert_int_eq(v, MOE_COMM_SELF);
    ck_assert_int_eq(sub->timeout_ms, c->timeout_ms);
    moe_comm *none = SENTINEL_PTR;
    ck_assert_int_eq(moe_comm_split(c, -1, 0, &none), MOE_OK);
    ck_assert_ptr_null(none);
    ck_assert_int_eq(moe_comm_split(c, 0, 0, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "out");
    ck_assert_int_eq(moe_comm_split(NULL, 0, 0, &none), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(NULL, MOE_ERR_INVALID_ARGUMENT, "comm");
    moe_comm_destroy(c); /* the sub-comm outlives its parent */
    ck_assert_int_eq(sub->ops->barrier(sub), MOE_OK);
    moe_comm_destroy(sub);
    moe_context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------ lifetimes */
typedef struct release_count {
    int releases;
} release_count;
static void count_release(void *ud) { ((release_count *)ud)->releases++; }
static void ignore_log(void *ud, int32_t level, const char *msg)
{
    (void)ud;
    (void)level;
    (void)msg;
}

START_TEST(test_refcount_and_destroy_order)
{
    release_count rc = {0};
    moe_logger lg;
    memset(&lg, 0, sizeof lg);
    lg.struct_size = sizeof lg;
    lg.user_data = &rc;
    lg.log = ignore_log;
    lg.release = count_release;
    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    cc.logger = &lg;
    moe_context *ctx = NULL;
    ck_assert_int_eq(moe_context_create(&cc, &ctx), MOE_OK);
    moe_comm *c = make_self(ctx);
    moe_comm_retain(c); /* an engine object (layer, dispatcher) holding the comm */
    moe_context_destroy(ctx);
    ck_assert_int_eq(rc.releases, 0); /* the comm keeps its context alive */
    moe_comm_destroy(c);
    ck_assert_int_eq(c->ops->barrier(c), MOE_OK); /* still alive: one reference left */
    ck_assert_int_eq(rc.releases, 0);
    moe_comm_release_ref(c);
    ck_assert_int_eq(rc.releases, 1);
}
END_TEST

/* ------------------------------------------------------------------ hooks */
/* A simulated two-rank world: this process is rank `rank`, the peer's contribution is computed. */
typedef struct fake_world {
    int32_t rank, size;
    int calls_a2a, calls_gather, calls_reduce, calls_bcast, calls_barrier, releases;
    int fail_next;          /* the next hook returns this (0 = succeed) */
    int64_t last_count;     /* of all_reduce */
    int32_t last_dtype;
    const void *user_seen;  /* the user_data every hook received */
} fake_world;

/* Byte b of the block peer p sends to rank q. */
static unsigned char pattern(int32_t p, int32_t q, int64_t b) { return (unsigned char)(p * 64 + q * 16 + b); }

static int32_t fake_a2a(void *ud, const void *send, const int64_t *send_bytes, const int64_t *send_offsets, void *recv,
                        const int64_t *recv_bytes, const int64_t *recv_offsets)
{
    fake_world *w = ud;
    w->user_seen = ud;
    w->calls_a2a++;
    if (w->fail_next) return w->fail_next;
    for (int32_t p = 0; p < w->size; p++) {
        unsigned char *dst = (unsigned char *)recv + recv_offsets[p];
        if (p == w->rank) {
            if (send_bytes[p] != recv_bytes[p]) return 9;
            memcpy(dst, (const char *)send + send_offsets[p], (size_t)recv_bytes[p]);
        } else {
            for (int64_t b = 0; b < recv_bytes[p]; b++) dst[b] = pattern(p, w->rank, b);
        }
    }
    return 0;
}

static int32_t fake_gather(void *ud, const void *send, int64_t send_bytes, void *recv, const int64_t *recv_bytes,
                           const int64_t *recv_offsets)
{
    fake_world *w = ud;
    w->calls_gather++;
    if (w->fail_next) return w->fail_next;
    for (int32_t p = 0; p < w->size; p++) {
        unsigned char *dst = (unsigned char *)recv + recv_offsets[p];
        if (p == w->rank)
            memcpy(dst, send, (size_t)send_bytes);
        else
            for (int64_t b = 0; b < recv_bytes[p]; b++) dst[b] = pattern(p, p, b);
    }
    return 0;
}

/* The peer contributes 100 * (i + 1) to element i. */
static int32_t fake_reduce(void *ud, void *buf, int64_t count, int32_t dtype)
{
    fake_world *w = ud;
    w->calls_reduce++;
    w->last_count = count;
    w->last_dtype = dtype;
    if (w->fail_next) return w->fail_next;
    for (int64_t i = 0; i < count; i++) {
        if (dtype == MOE_DTYPE_FP32) ((float *)buf)[i] += 100.0f * (float)(i + 1);
        else if (dtype == MOE_DTYPE_FP64) ((double *)buf)[i] += 100.0 * (double)(i + 1);
        else ((int64_t *)buf)[i] += 100 * (i + 1);
    }
    return 0;
}

static int32_t fake_bcast(void *ud, void *buf, int64_t bytes, int32_t root)
{
    fake_world *w = ud;
    w->calls_bcast++;
    if (w->fail_next) return w->fail_next;
    if (root != w->rank)
        for (int64_t b = 0; b < bytes; b++) ((unsigned char *)buf)[b] = pattern(root, root, b);
    return 0;
}

static int32_t fake_barrier(void *ud)
{
    fake_world *w = ud;
    w->calls_barrier++;
    return w->fail_next;
}

static void fake_release(void *ud) { ((fake_world *)ud)->releases++; }

static moe_comm_hooks make_hooks(fake_world *w)
{
    moe_comm_hooks h;
    memset(&h, 0, sizeof h);
    h.struct_size = sizeof h;
    h.rank = w->rank;
    h.size = w->size;
    h.user_data = w;
    h.all_to_all_v = fake_a2a;
    h.all_gather_v = fake_gather;
    h.all_reduce = fake_reduce;
    h.broadcast = fake_bcast;
    h.barrier = fake_barrier;
    h.release = fake_release;
    return h;
}

START_TEST(test_hooks_two_rank_world)
{
    moe_context *ctx = make_ctx();
    fake_world w = {.rank = 1, .size = 2};
    moe_comm_hooks h = make_hooks(&w);
    moe_comm *c = NULL;
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, &h, &c), MOE_OK);
    int32_t v;
    moe_comm_rank(c, &v);
    ck_assert_int_eq(v, 1);
    moe_comm_size(c, &v);
    ck_assert_int_eq(v, 2);
    moe_comm_kind(c, &v);
    ck_assert_int_eq(v, MOE_COMM_HOOKS);

    /* all_to_all_v: block to self of 3 bytes, 4 bytes from the peer placed first */
    unsigned char send[8] = {0, 0, 11, 12, 13, 0, 0, 0}, recv[10];
    memset(recv, 0, sizeof recv);
    int64_t sb[2] = {0, 3}, so[2] = {0, 2}, rb[2] = {4, 3}, ro[2] = {0, 6};
    ck_assert_int_eq(c->ops->all_to_all_v(c, send, sb, so, recv, rb, ro, NULL), MOE_OK);
    ck_assert_ptr_eq(w.user_seen, &w);
    for (int b = 0; b < 4; b++) ck_assert_uint_eq(recv[b], pattern(0, 1, b));
    ck_assert_uint_eq(recv[6], 11);
    ck_assert_uint_eq(recv[8], 13);
    moe_comm_request *req = NULL;
    ck_assert_int_eq(c->ops->all_to_all_v_start(c, send, sb, so, recv, rb, ro, &req, NULL), MOE_OK);
    int32_t done = 0; /* the hook ran inside start: test reports it done without calling it again */
    ck_assert_int_eq(c->ops->test(c, req, &done), MOE_OK);
    ck_assert_int_eq(done, 1);
    ck_assert_int_eq(c->ops->wait(c, req), MOE_OK);
    ck_assert_int_eq(w.calls_a2a, 2);

    /* all_gather_v */
    unsigned char mine[2] = {7, 8}, all[5];
    int64_t gb[2] = {3, 2}, go[2] = {2, 0};
    ck_assert_int_eq(c->ops->all_gather_v(c, mine, 2, all, gb, go, NULL), MOE_OK);
    ck_assert_uint_eq(all[0], 7);
    ck_assert_uint_eq(all[1], 8);
    for (int b = 0; b < 3; b++) ck_assert_uint_eq(all[2 + b], pattern(0, 0, b));

    /* all_reduce, each dtype */
    float f[2] = {1, 2};
    ck_assert_int_eq(c->ops->all_reduce(c, f, 2, MOE_DTYPE_FP32, NULL), MOE_OK);
    ck_assert(f[0] == 101 && f[1] == 202);
    int64_t l[3] = {1, 2, 3};
    ck_assert_int_eq(c->ops->all_reduce(c, l, 3, MOE_DTYPE_INT64, NULL), MOE_OK);
    ck_assert(l[0] == 101 && l[2] == 303);

    /* reduce_scatter: blocks of 2 (rank 0) and 3 (rank 1) elements; this rank gets elements 2..4 of
     * the all-reduced copy; send is not modified */
    double send_d[5] = {1, 2, 3, 4, 5}, recv_d[3] = {0, 0, 0};
    int64_t counts[2] = {2, 3};
    ck_assert_int_eq(c->ops->reduce_scatter(c, send_d, recv_d, counts, MOE_DTYPE_FP64, NULL), MOE_OK);
    ck_assert(recv_d[0] == 3 + 300 && recv_d[1] == 4 + 400 && recv_d[2] == 5 + 500);
    ck_assert(send_d[0] == 1 && send_d[4] == 5);
    ck_assert_int_eq(w.last_count, 5);
    ck_assert_int_eq(w.last_dtype, MOE_DTYPE_FP64);
    moe_memory_stats ms;
    memset(&ms, 0, sizeof ms);
    ms.struct_size = sizeof ms;
    moe_context_memory_stats(ctx, &ms);
    ck_assert_int_eq(ms.current_bytes[MOE_MEM_COMM], 0);   /* the copy was returned */
    ck_assert_int_ge(ms.peak_bytes[MOE_MEM_COMM], 5 * 8); /* and charged to MOE_MEM_COMM */
    int64_t zc[2] = {0, 0};
    int before = w.calls_reduce;
    ck_assert_int_eq(c->ops->reduce_scatter(c, NULL, NULL, zc, MOE_DTYPE_FP32, NULL), MOE_OK);
    ck_assert_int_eq(w.calls_reduce, before); /* nothing to reduce: no call */
    int64_t zmine[2] = {2, 0};
    ck_assert_int_eq(c->ops->reduce_scatter(c, send_d, NULL, zmine, MOE_DTYPE_FP64, NULL), MOE_OK);

    /* broadcast from the peer, and from this rank */
    unsigned char bb[4] = {1, 2, 3, 4};
    ck_assert_int_eq(c->ops->broadcast(c, bb, 4, 0, NULL), MOE_OK);
    ck_assert_uint_eq(bb[3], pattern(0, 0, 3));
    ck_assert_int_eq(c->ops->broadcast(c, bb, 4, 2, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "root");
    ck_assert_int_eq(c->ops->barrier(c), MOE_OK);
    ck_assert_int_eq(w.calls_barrier, 1);

    /* split is not available for hook comms */
    moe_comm *sub = SENTINEL_PTR;
    ck_assert_int_eq(moe_comm_split(c, 0, 0, &sub), MOE_ERR_UNSUPPORTED);
    expect_msg(ctx, MOE_ERR_UNSUPPORTED, "hook");
    ck_assert_ptr_eq(sub, SENTINEL_PTR);

    ck_assert_int_eq(w.releases, 0);
    moe_comm_destroy(c);
    ck_assert_int_eq(w.releases, 1);
    moe_context_destroy(ctx);
    ck_assert_int_eq(w.releases, 1);
}
END_TEST

START_TEST(test_hooks_one_rank_identity)
{
    moe_context *ctx = make_ctx();
    fake_world w = {.rank = 0, .size = 1};
    moe_comm_hooks h = make_hooks(&w);
    h.barrier = NULL; /* falls back to an all_reduce of one int64 */
    h.release = NULL; /* may be NULL */
    moe_comm *c = NULL;
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, &h, &c), MOE_OK);
    unsigned char send[3] = {1, 2, 3}, recv[3] = {0, 0, 0};
    int64_t b[1] = {3}, o[1] = {0};
    ck_assert_int_eq(c->ops->all_to_all_v(c, send, b, o, recv, b, o, NULL), MOE_OK);
    ck_assert(memcmp(send, recv, 3) == 0);
    ck_assert_int_eq(c->ops->barrier(c), MOE_OK);
    ck_assert_int_eq(w.calls_reduce, 1);
    ck_assert_int_eq(w.last_count, 1);
    ck_assert_int_eq(w.last_dtype, MOE_DTYPE_INT64);
    moe_comm_destroy(c);
    moe_context_destroy(ctx);
}
END_TEST

START_TEST(test_hook_failure_breaks_comm)
{
    /* _i: which collective fails */
    moe_context *ctx = make_ctx();
    fake_world w = {.rank = 0, .size = 2};
    moe_comm_hooks h = make_hooks(&w);
    moe_comm *c = NULL;
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, &h, &c), MOE_OK);
    w.fail_next = -3;
    unsigned char buf[8] = {0};
    int64_t b[2] = {1, 1}, o[2] = {0, 1}, counts[2] = {1, 1};
    double d[2] = {1, 2}, r[1];
    int32_t st = MOE_OK;
    const char *name = "";
    switch (_i) {
    case 0: st = c->ops->all_to_all_v(c, buf, b, o, buf + 4, b, o, NULL); name = "all_to_all_v"; break;
    case 1: st = c->ops->all_gather_v(c, buf, 1, buf + 4, b, o, NULL); name = "all_gather_v"; break;
    case 2: st = c->ops->all_reduce(c, d, 2, MOE_DTYPE_FP64, NULL); name = "all_reduce"; break;
    case 3: st = c->ops->reduce_scatter(c, d, r, counts, MOE_DTYPE_FP64, NULL); name = "all_reduce (for reduce_scatter)"; break;
    case 4: st = c->ops->broadcast(c, buf, 8, 1, NULL); name = "broadcast"; break;
    default: st = c->ops->barrier(c); name = "barrier"; break;
    }
    ck_assert_int_eq(st, MOE_ERR_CALLBACK);
    expect_msg(ctx, MOE_ERR_CALLBACK, name);
    expect_msg(ctx, MOE_ERR_CALLBACK, "-3");
    ck_assert(d[0] == 1 && d[1] == 2); /* a failed hook left the buffers alone; reduce_scatter never touches send */
    moe_memory_stats ms;
    memset(&ms, 0, sizeof ms);
    ms.struct_size = sizeof ms;
    moe_context_memory_stats(ctx, &ms);
    ck_assert_int_eq(ms.current_bytes[MOE_MEM_COMM], 0);
    /* the comm is now broken: every call fails fast without calling a hook */
    w.fail_next = 0;
    int calls = w.calls_a2a + w.calls_gather + w.calls_reduce + w.calls_bcast + w.calls_barrier;
    ck_assert_int_eq(c->ops->barrier(c), MOE_ERR_COMM);
    expect_msg(ctx, MOE_ERR_COMM, "unusable");
    ck_assert_int_eq(c->ops->all_reduce(c, d, 2, MOE_DTYPE_FP64, NULL), MOE_ERR_COMM);
    ck_assert_int_eq(w.calls_a2a + w.calls_gather + w.calls_reduce + w.calls_bcast + w.calls_barrier, calls);
    moe_comm_destroy(c);
    ck_assert_int_eq(w.releases, 1);
    moe_context_destroy(ctx);
}
END_TEST

START_TEST(test_hooks_bad_tables)
{
    moe_context *ctx = make_ctx();
    fake_world w = {.rank = 0, .size = 2};
    moe_comm *out = SENTINEL_PTR;
    moe_comm_hooks h = make_hooks(&w);
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, NULL, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "hooks");
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, &h, NULL), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "out");
    ck_assert_int_eq(moe_comm_create_hooks(NULL, NULL, &h, &out), MOE_ERR_INVALID_ARGUMENT);
    h.struct_size = 16;
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, &h, &out), MOE_ERR_VERSION);
    expect_msg(ctx, MOE_ERR_VERSION, "struct_size");
    h = make_hooks(&w);
    h.size = 0;
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, &h, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "hooks->size");
    h = make_hooks(&w);
    h.rank = 2;
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, &h, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "hooks->rank");
    h = make_hooks(&w);
    h.all_reduce = NULL;
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, &h, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "all_reduce");
    h = make_hooks(&w);
    h.broadcast = NULL;
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, &h, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "broadcast");
    ck_assert_ptr_eq(out, SENTINEL_PTR);
    ck_assert_int_eq(w.releases, 0); /* failed creation takes no ownership */
    /* a larger table from a newer host: the known entries are used */
    struct {
        moe_comm_hooks h;
        void *extra;
    } big;
    memset(&big, 0, sizeof big);
    big.h = make_hooks(&w);
    big.h.struct_size = sizeof big;
    ck_assert_int_eq(moe_comm_create_hooks(ctx, NULL, &big.h, &out), MOE_OK);
    moe_comm_destroy(out);
    ck_assert_int_eq(w.releases, 1);
    moe_context_destroy(ctx);
}
END_TEST

/* ------------------------------------------------------------------ MPI and NCCL without peers */
START_TEST(test_mpi_and_nccl_entry_points)
{
    moe_context *ctx = make_ctx();
    uint64_t f = moe_build_features();
    moe_comm *out = SENTINEL_PTR;
    int32_t st = moe_comm_create_mpi(ctx, NULL, NULL, &out);
    if (f & MOE_FEATURE_MPI) {
        ck_assert_int_eq(st, MOE_ERR_STATE); /* this process never called MPI_Init */
        expect_msg(ctx, MOE_ERR_STATE, "MPI is not initialised");
    } else {
        ck_assert_int_eq(st, MOE_ERR_UNSUPPORTED);
        expect_msg(ctx, MOE_ERR_UNSUPPORTED, "MOE_FEATURE_MPI");
    }
    ck_assert_ptr_eq(out, SENTINEL_PTR);
    ck_assert_int_eq(moe_comm_create_mpi(ctx, NULL, NULL, NULL), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(moe_comm_create_mpi(NULL, NULL, NULL, &out), MOE_ERR_INVALID_ARGUMENT);

    unsigned char id[128];
    size_t len = 0;
    ck_assert_int_eq(moe_comm_nccl_unique_id(NULL, 128, &len), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(NULL, MOE_ERR_INVALID_ARGUMENT, "buf");
    ck_assert_int_eq(moe_comm_nccl_unique_id(id, 64, &len), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(NULL, MOE_ERR_INVALID_ARGUMENT, "cap");
    ck_assert_int_eq(moe_comm_nccl_unique_id(id, 128, NULL), MOE_ERR_INVALID_ARGUMENT);
    if (!(f & MOE_FEATURE_NCCL)) {
        ck_assert_int_eq(moe_comm_nccl_unique_id(id, sizeof id, &len), MOE_ERR_UNSUPPORTED);
        expect_msg(NULL, MOE_ERR_UNSUPPORTED, "MOE_FEATURE_NCCL");
    }
    memset(id, 0, sizeof id);
    ck_assert_int_eq(moe_comm_create_nccl(ctx, NULL, NULL, 128, 0, 1, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "unique_id");
    ck_assert_int_eq(moe_comm_create_nccl(ctx, NULL, id, 127, 0, 1, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "id_len");
    ck_assert_int_eq(moe_comm_create_nccl(ctx, NULL, id, 128, 0, 0, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "size");
    ck_assert_int_eq(moe_comm_create_nccl(ctx, NULL, id, 128, 2, 2, &out), MOE_ERR_INVALID_ARGUMENT);
    expect_msg(ctx, MOE_ERR_INVALID_ARGUMENT, "rank");
    ck_assert_int_eq(moe_comm_create_nccl(ctx, NULL, id, 128, -1, 2, &out), MOE_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(moe_comm_create_nccl(ctx, NULL, id, 128, 0, 1, NULL), MOE_ERR_INVALID_ARGUMENT);
    if (!(f & MOE_FEATURE_NCCL)) {
        ck_assert_int_eq(moe_comm_create_nccl(ctx, NULL, id, 128, 0, 1, &out), MOE_ERR_UNSUPPORTED);
        expect_msg(ctx, MOE_ERR_UNSUPPORTED, "MOE_FEATURE_NCCL");
    }
    ck_assert_ptr_eq(out, SENTINEL_PTR);
    moe_context_destroy(ctx);
}
END_TEST

static Suite *comm_suite(void)
{
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("self");
    tcase_add_test(tc, test_config_init_and_checks);
    tcase_add_test(tc, test_rank_size_kind);
    tcase_add_test(tc, test_self_all_to_all_v);
    tcase_add_test(tc, test_self_all_gather_v);
    tcase_add_test(tc, test_self_reductions);
    tcase_add_test(tc, test_self_broadcast_barrier_split);
    tcase_add_test(tc, test_refcount_and_destroy_order);
    suite_add_tcase(s, tc);
    TCase *th = tcase_create("hooks");
    tcase_add_test(th, test_hooks_two_rank_world);
    tcase_add_test(th, test_hooks_one_rank_identity);
    tcase_add_loop_test(th, test_hook_failure_breaks_comm, 0, 6);
    tcase_add_test(th, test_hooks_bad_tables);
    suite_add_tcase(s, th);
    TCase *tx = tcase_create("mpi_nccl");
    tcase_add_test(tx, test_mpi_and_nccl_entry_points);
    suite_add_tcase(s, tx);
    return s;
}

int main(void) { return tu_run_suite(comm_suite()); }

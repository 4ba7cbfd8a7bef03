/*
 * The NCCL communicator on one rank and one GPU: every collective on device buffers, the
 * non-blocking all-to-all, split, host pointers rejected, and a peer that never arrives (a 2-rank
 * comm whose rank 1 never calls create) returning MOE_ERR_TIMEOUT instead of hanging.
 * Without a GPU: moe_comm_create_nccl must fail with MOE_ERR_BACKEND and a clear message; the test
 * then exits 77 (CTest: skipped). Prints "N passed, M failed" last.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "comm/comm.h"
#include "moe.h"

static int g_passed, g_failed;
static moe_context *g_ctx;

static void check(int ok, int line, const char *what)
{
    if (ok) {
        g_passed++;
        return;
    }
    g_failed++;
    printf("FAIL: line %d: %s\n", line, what);
}
#define CHECK(cond) check((cond) ? 1 : 0, __LINE__, #cond)

static void check_status(int32_t got, int32_t want, int line, const char *call)
{
    if (got == want) {
        g_passed++;
        return;
    }
    char msg[1024];
    moe_context_last_error(g_ctx, msg, sizeof msg);
    g_failed++;
    printf("FAIL: line %d: %s returned %s, expected %s (%s)\n", line, call, moe_status_name(got), moe_status_name(want), msg);
}
#define CHECK_ST(call, want) check_status((call), (want), __LINE__, #call)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return NULL;
    return p;
}

/* cudaMemcpy from pageable memory and cudaMemset run on the legacy stream and may land after they
 * return; the comm's collectives run on non-blocking streams that do not wait for it (CUDA Runtime
 * API, "API synchronization behavior"): synchronise before the comm reads the buffers. */
static void to_dev(void *d, const void *h, size_t n)
{
    cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
}
static void dev_zero(void *d, size_t n)
{
    cudaMemset(d, 0, n);
    cudaDeviceSynchronize();
}
static void to_host(void *h, const void *d, size_t n) { cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost); }

static void test_collectives(moe_comm *c)
{
    unsigned char h[64], back[64];
    for (int i = 0; i < 64; i++) h[i] = (unsigned char)(i * 3 + 1);
    unsigned char *send = dev_alloc(64), *recv = dev_alloc(64);
    CHECK(send && recv);
    if (!send || !recv) return;
    to_dev(send, h, 64);
    dev_zero(recv, 64);

    /* all_to_all_v: the block to self, at offsets */
    int64_t sb[1] = {20}, so[1] = {4}, rb[1] = {20}, ro[1] = {30};
    CHECK_ST(c->ops->all_to_all_v(c, send, sb, so, recv, rb, ro, NULL), MOE_OK);
    to_host(back, recv, 64);
    int ok = 1;
    for (int i = 0; i < 64; i++)
        if (back[i] != (i >= 30 && i < 50 ? h[i - 26] : 0)) ok = 0;
    CHECK(ok);
    moe_comm_request *req = NULL;
    dev_zero(recv, 64);
    CHECK_ST(c->ops->all_to_all_v_start(c, send, sb, so, recv, rb, ro, &req, NULL), MOE_OK);
    if (req) CHECK_ST(c->ops->wait(c, req), MOE_OK);
    to_host(back, recv, 64);
    CHECK(back[30] == h[4] && back[49] == h[23]);
    /* host pointers are rejected */
    CHECK_ST(c->ops->all_to_all_v(c, h, sb, so, recv, rb, ro, NULL), MOE_ERR_INVALID_ARGUMENT);

    /* all_gather_v: back to back (ncclAllGather) and at an offset (broadcasts) */
    int64_t gb[1] = {16}, go[1] = {0}, go8[1] = {8};
    dev_zero(recv, 64);
    CHECK_ST(c->ops->all_gather_v(c, send, 16, recv, gb, go, NULL), MOE_OK);
    to_host(back, recv, 64);
    CHECK(memcmp(back, h, 16) == 0 && back[16] == 0);
    dev_zero(recv, 64);
    CHECK_ST(c->ops->all_gather_v(c, send, 16, recv, gb, go8, NULL), MOE_OK);
    to_host(back, recv, 64);
    CHECK(back[7] == 0 && memcmp(back + 8, h, 16) == 0 && back[24] == 0);

    /* reductions: one rank's sum is the identity */
    double d[6] = {1, -2, 3.5, 4, 5, 6}, dd[6];
    int64_t l[3] = {INT64_MAX, -1, 7}, ll[3];
    double *dev_d = dev_alloc(sizeof d), *dev_r = dev_alloc(sizeof d);
    int64_t *dev_l = dev_alloc(sizeof l);
    to_dev(dev_d, d, sizeof d);
    to_dev(dev_l, l, sizeof l);
    CHECK_ST(c->ops->all_reduce(c, dev_d, 6, MOE_DTYPE_FP64, NULL), MOE_OK);
    CHECK_ST(c->ops->all_reduce(c, dev_l, 3, MOE_DTYPE_INT64, NULL), MOE_OK);
    CHECK_ST(c->ops->all_reduce(c, dev_d, 3, MOE_DTYPE_FP32, NULL), MOE_OK); /* reinterprets 12 bytes: still the identity */
    to_host(dd, dev_d, sizeof d);
    to_host(ll, dev_l, sizeof l);
    CHECK(memcmp(dd, d, sizeof d) == 0);
    CHECK(memcmp(ll, l, sizeof l) == 0);
    int64_t counts[1] = {6};
    CHECK_ST(c->ops->reduce_scatter(c, dev_d, dev_r, counts, MOE_DTYPE_FP64, NULL), MOE_OK);
    to_host(dd, dev_r, sizeof d);
    CHECK(memcmp(dd, d, sizeof d) == 0);

    /* broadcast, barrier, zero-byte calls */
    CHECK_ST(c->ops->broadcast(c, send, 64, 0, NULL), MOE_OK);
    to_host(back, send, 64);
    CHECK(memcmp(back, h, 64) == 0);
    CHECK_ST(c->ops->broadcast(c, send, 64, 1, NULL), MOE_ERR_INVALID_ARGUMENT);
    CHECK_ST(c->ops->barrier(c), MOE_OK);
    int64_t z[1] = {0};
    CHECK_ST(c->ops->all_to_all_v(c, NULL, z, z, NULL, z, z, NULL), MOE_OK);
    CHECK_ST(c->ops->all_gather_v(c, NULL, 0, NULL, z, z, NULL), MOE_OK);
    CHECK_ST(c->ops->all_reduce(c, NULL, 0, MOE_DTYPE_FP32, NULL), MOE_OK);
    CHECK_ST(c->ops->broadcast(c, NULL, 0, 0, NULL), MOE_OK);
    CHECK(c->broken == 0);
    cudaFree(send);
    cudaFree(recv);
    cudaFree(dev_d);
    cudaFree(dev_r);
    cudaFree(dev_l);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (moe_context_create(NULL, &g_ctx) != MOE_OK) {
        printf("FAIL: moe_context_create\n0 passed, 1 failed\n");
        return 1;
    }
    CHECK((moe_build_features() & MOE_FEATURE_NCCL) != 0);
    unsigned char id[128];
    size_t len = 0;
    int32_t st_id = moe_comm_nccl_unique_id(id, sizeof id, &len);
    moe_comm_config cfg;
    moe_comm_config_init(&cfg, sizeof cfg);
    cfg.timeout_ms = 20000;

    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        /* no GPU: a clear error, no crash, no hang */
        moe_comm *c = NULL;
        memset(id, 0, sizeof id);
        CHECK_ST(moe_comm_create_nccl(g_ctx, &cfg, id, sizeof id, 0, 1, &c), MOE_ERR_BACKEND);
        char msg[1024];
        moe_context_last_error(g_ctx, msg, sizeof msg);
        CHECK(strstr(msg, "no CUDA device") != NULL);
        CHECK(c == NULL);
        printf("no CUDA device (moe_comm_nccl_unique_id: %s): GPU part skipped\n", moe_status_name(st_id));
        printf("%d passed, %d failed\n", g_passed, g_failed);
        moe_context_destroy(g_ctx);
        return g_failed ? 1 : 77;
    }

    CHECK_ST(st_id, MOE_OK);
    CHECK(len == 128);
    moe_comm *c = NULL;
    CHECK_ST(moe_comm_create_nccl(g_ctx, &cfg, id, len, 0, 1, &c), MOE_OK);
    if (c) {
        int32_t v = -1;
        moe_comm_kind(c, &v);
        CHECK(v == MOE_COMM_NCCL);
        moe_comm_size(c, &v);
        CHECK(v == 1);
        test_collectives(c);
        moe_comm *sub = NULL, *none = c;
        CHECK_ST(moe_comm_split(c, 0, 0, &sub), MOE_OK);
        if (sub) {
            CHECK(sub->size == 1 && sub->kind == MOE_COMM_NCCL);
            test_collectives(sub);
        }
        CHECK_ST(moe_comm_split(c, -1, 0, &none), MOE_OK);
        CHECK(none == NULL);
        moe_comm_destroy(c); /* the sub-comm outlives its parent */
        if (sub) CHECK_ST(sub->ops->barrier(sub), MOE_OK);
        moe_comm_destroy(sub);
    }

    /* a peer that never arrives: rank 0 of 2 alone */
    CHECK_ST(moe_comm_nccl_unique_id(id, sizeof id, &len), MOE_OK);
    cfg.timeout_ms = 1500;
    moe_comm *lonely = NULL;
    double t0 = now_s();
    CHECK_ST(moe_comm_create_nccl(g_ctx, &cfg, id, len, 0, 2, &lonely), MOE_ERR_TIMEOUT);
    double dt = now_s() - t0;
    printf("lonely NCCL init returned after %.3f s\n", dt);
    CHECK(dt < 1.5 + 1.0);
    CHECK(lonely == NULL);

    moe_context_destroy(g_ctx);
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}

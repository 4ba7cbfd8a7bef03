/*
 * The simulator's own semantics (sim.h): what a kernel may rely on, and the mistakes it must expose.
 * Prints "N passed, M failed" last; exit status 1 on a failure.
 */
#include <cstdio>
#include <algorithm>
#include <vector>

#include "moe.h"
#include "sim.h"
#include "checks.h"


__global__ void reverse_shared(int *o)
{
    __shared__ int s[128];
    s[threadIdx.x] = (int)(blockIdx.x * 1000 + threadIdx.x);
    __syncthreads();
    o[blockIdx.x * blockDim.x + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

__global__ void reverse_no_sync(int *o)
{
    __shared__ int s[128];
    s[threadIdx.x] = (int)(blockIdx.x * 1000 + threadIdx.x);
    o[blockIdx.x * blockDim.x + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x]; /* race */
}

__global__ void early_exit_then_sync(int *o)
{
    if (threadIdx.x >= 16) return;
    __syncthreads();
    o[threadIdx.x] = 1;
}

__global__ void warp_ops(int *o)
{
    int v = (int)threadIdx.x;
    int sum = v;
    for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    int down = __shfl_down_sync(0xffffffffu, v, 1);
    int up = __shfl_up_sync(0xffffffffu, v, 1);
    int bcast = __shfl_sync(0xffffffffu, v, 5);
    unsigned ballot = __ballot_sync(0xffffffffu, v % 2);
    int all = __all_sync(0xffffffffu, v < 64);
    int any = __any_sync(0xffffffffu, v == 63);
    int i = (int)threadIdx.x * 7;
    o[i] = sum, o[i + 1] = down, o[i + 2] = up, o[i + 3] = bcast, o[i + 4] = (int)ballot, o[i + 5] = all,
    o[i + 6] = any;
}

__global__ void atomics(int *counter) { atomicAdd(counter, 1); }

/* o[block] = the thread that ran first in it */
__global__ void first_thread(int *o, int *ticket)
{
    if (atomicAdd(&ticket[blockIdx.x], 1) == 0) o[blockIdx.x] = (int)threadIdx.x;
}

int main()
{
    std::vector<int> o(4 * 128, -1);
    CHECK(moe_sim::launch("reverse_shared", dim3(4), dim3(128), [&] { reverse_shared(o.data()); }) == MOE_OK);
    bool ok = true;
    for (int b = 0; b < 4; b++)
        for (int t = 0; t < 128; t++) ok = ok && o[b * 128 + t] == b * 1000 + 127 - t;
    CHECK(ok);

    /* without the barrier, at least one block (forward or reverse thread order) reads stale data */
    std::fill(o.begin(), o.end(), -1);
    CHECK(moe_sim::launch("reverse_no_sync", dim3(4), dim3(128), [&] { reverse_no_sync(o.data()); }) == MOE_OK);
    ok = true;
    for (int b = 0; b < 4; b++)
        for (int t = 0; t < 128; t++) ok = ok && o[b * 128 + t] == b * 1000 + 127 - t;
    CHECK(!ok);

    /* a __syncthreads some threads exit without reaching is an error, and the next launch still works */
    CHECK(moe_sim::launch("early_exit_then_sync", dim3(1), dim3(64), [&] { early_exit_then_sync(o.data()); }) ==
          MOE_ERR_INTERNAL);
    CHECK(moe_sim::launch("reverse_shared", dim3(1), dim3(128), [&] { reverse_shared(o.data()); }) == MOE_OK);
    CHECK(o[0] == 127);

    std::vector<int> w(64 * 7);
    CHECK(moe_sim::launch("warp_ops", dim3(1), dim3(64), [&] { warp_ops(w.data()); }) == MOE_OK);
    for (int t = 0; t < 64; t++) {
        int lane = t % 32, base = t - lane;
        const int *r = &w[t * 7];
        CHECK(r[0] == 32 * base + 496);                   /* sum of the warp's lanes */
        CHECK(r[1] == (lane < 31 ? t + 1 : t));           /* down: the last lane keeps its own */
        CHECK(r[2] == (lane > 0 ? t - 1 : t));            /* up: lane 0 keeps its own */
        CHECK(r[3] == base + 5);
        CHECK((unsigned)r[4] == 0xaaaaaaaau);
        CHECK(r[5] == 1);
        CHECK(r[6] == (base == 32));
    }

    int counter = 0;
    CHECK(moe_sim::launch("atomics", dim3(3), dim3(256), [&] { atomics(&counter); }) == MOE_OK);
    CHECK(counter == 768);

    /* a single-block launch runs forward in some launches and reversed in others (the order seed), the
     * same way for the same seed; the blocks of one launch alternate */
    {
        int fwd = 0, rev = 0, first[2][16];
        for (int round = 0; round < 2; round++) {
            moe_sim::set_order_seed(12345);
            for (int l = 0; l < 16; l++) {
                int f = -1, ticket = 0;
                CHECK(moe_sim::launch("first_thread", dim3(1), dim3(64), [&] { first_thread(&f, &ticket); }) == MOE_OK);
                first[round][l] = f;
                fwd += f == 0, rev += f == 63;
            }
        }
        CHECK(fwd > 0 && rev > 0 && fwd + rev == 32);
        CHECK(std::equal(first[0], first[0] + 16, first[1]));
        moe_sim::set_order_seed(12345, true); /* inverted: every launch the other way */
        for (int l = 0; l < 16; l++) {
            int f = -1, ticket = 0;
            CHECK(moe_sim::launch("first_thread", dim3(1), dim3(64), [&] { first_thread(&f, &ticket); }) == MOE_OK);
            CHECK(f == 63 - first[0][l]);
        }
        CHECK(moe_sim::single_block_launches() == 16);
        int f2[2] = {-1, -1}, t2[2] = {0, 0};
        CHECK(moe_sim::launch("first_thread", dim3(2), dim3(64), [&] { first_thread(f2, t2); }) == MOE_OK);
        CHECK(f2[0] + f2[1] == 63);
    }

    /* block sampling: only the first, the last and the seeded blocks run */
    {
        std::vector<int> f(1000, -1), t(1000, 0);
        moe_sim::set_block_sample(3, 7);
        CHECK(moe_sim::launch("first_thread", dim3(1000), dim3(32), [&] { first_thread(f.data(), t.data()); }) ==
              MOE_OK);
        moe_sim::set_block_sample(-1, 0);
        int ran = 0;
        for (int b = 0; b < 1000; b++) ran += t[b] == 32;
        CHECK(t[0] == 32 && t[999] == 32 && ran >= 2 && ran <= 5);
        for (int b = 0; b < 1000; b++) CHECK(t[b] == 0 || t[b] == 32);
        counter = 0;
        CHECK(moe_sim::launch("atomics", dim3(3), dim3(256), [&] { atomics(&counter); }) == MOE_OK);
        CHECK(counter == 768); /* sampling off again: every block */
    }

    /* launch configurations a GPU refuses */
    CHECK(moe_sim::launch("atomics", dim3(0), dim3(32), [&] { atomics(&counter); }) == MOE_ERR_BACKEND);
    CHECK(moe_sim::launch("atomics", dim3(1), dim3(2048), [&] { atomics(&counter); }) == MOE_ERR_BACKEND);

    std::printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/*
 * The simulator's runtime: launches, fibers, barriers and warp collectives (see sim.h for the model).
 *
 * A block's threads are fibers (ucontext). The scheduler runs every runnable fiber once per pass,
 * forward or reverse: block b of a launch runs in order (b & 1) ^ flip, flip a bit of a hash of
 * (order seed, launches since the seed was set), inverted on request, so the blocks of one launch
 * alternate and a single-block launch is reversed in about half of the launches, and in the other
 * half under the inverted seed (set_order_seed); a fiber runs until it exits or reaches a barrier. After a pass, a block barrier that every live thread has reached is released,
 * then each warp barrier whose named threads have all arrived; when nothing can be released the
 * block is stuck (a barrier some threads never reach) and the launch fails. Stacks are mmap'ed once
 * and reused; under AddressSanitizer every switch is announced (__sanitizer_*_switch_fiber).
 */
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "sim.h"

extern "C" {
#include "base/error.h"
}

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define SIM_ASAN 1
#endif

namespace moe_sim {

thread_pos *cur;
uint3 block_idx;
dim3 block_dim, grid_dim;

namespace {

/* splitmix64's finaliser */
uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t order_seed = 0, launches = 0, single_launches = 0; /* thread order: set_order_seed */
bool order_invert = false;
int sample_blocks = -1;                /* block sampling: set_block_sample (< 0: off) */
uint64_t sample_seed = 0;

enum { F_RUN, F_AT_BLOCK, F_AT_WARP, F_DONE };
constexpr size_t STACK_BYTES = 256 * 1024;
constexpr int MAX_THREADS = 1024;

struct fiber {
    ucontext_t uc;
    char *stack = nullptr;
    int state = F_DONE;
    unsigned wait_mask = 0; /* the warp barrier's mask while F_AT_WARP */
    unsigned long barriers = 0; /* block barriers passed */
    thread_pos pos;
    void *asan_fake = nullptr;
};

struct runtime {
    std::vector<fiber> fibers;
    ucontext_t sched;
    fiber *running = nullptr;
    const std::function<void()> *body = nullptr;
    uint64_t slot[MAX_THREADS / 32][32]; /* warp exchange slots */
    const void *sched_stack_bottom = nullptr;
    size_t sched_stack_size = 0;
    bool error = false;
    char what[200];
};

runtime rt;

void fail(const char *what)
{
    if (!rt.error) std::snprintf(rt.what, sizeof rt.what, "%s", what);
    rt.error = true;
}

/* Fiber -> scheduler. */
void yield_to_scheduler(bool dying)
{
    fiber *f = rt.running;
#if SIM_ASAN
    __sanitizer_start_switch_fiber(dying ? nullptr : &f->asan_fake, rt.sched_stack_bottom, rt.sched_stack_size);
#else
    (void)dying;
#endif
    swapcontext(&f->uc, &rt.sched);
#if SIM_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, &rt.sched_stack_bottom, &rt.sched_stack_size);
#endif
}

void trampoline()
{
#if SIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &rt.sched_stack_bottom, &rt.sched_stack_size);
#endif
    (*rt.body)();
    rt.running->state = F_DONE;
    yield_to_scheduler(true);
}

/* Scheduler -> fiber f, until it yields. */
void run_fiber(fiber *f)
{
    rt.running = f;
    cur = &f->pos;
#if SIM_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, STACK_BYTES);
#endif
    swapcontext(&rt.sched, &f->uc);
#if SIM_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    rt.running = nullptr;
}

bool ensure_fibers(int n)
{
    while ((int)rt.fibers.size() < n) rt.fibers.emplace_back();
    for (int i = 0; i < n; i++) {
        fiber &f = rt.fibers[i];
        if (f.stack) continue;
        void *p = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return false;
        f.stack = static_cast<char *>(p);
    }
    return true;
}

/* Releases what can be released after a pass; false when the block is stuck. */
bool release_barriers(int n)
{
    int live = 0, at_block = 0;
    for (int i = 0; i < n; i++) {
        live += rt.fibers[i].state != F_DONE;
        at_block += rt.fibers[i].state == F_AT_BLOCK;
    }
    if (live > 0 && at_block == live) {
        /* CUDA requires every thread of the block to reach a __syncthreads (exited threads do not
         * count): a thread that exited before this barrier is divergence, even where hardware lets it
         * pass */
        unsigned long gen = 0;
        for (int i = 0; i < n; i++)
            if (rt.fibers[i].state == F_AT_BLOCK) gen = rt.fibers[i].barriers;
        for (int i = 0; i < n; i++)
            if (rt.fibers[i].state == F_DONE && rt.fibers[i].barriers <= gen) {
                fail("barrier divergence: a __syncthreads that some threads exited without reaching");
                return false;
            }
        for (int i = 0; i < n; i++)
            if (rt.fibers[i].state == F_AT_BLOCK) {
                rt.fibers[i].state = F_RUN;
                rt.fibers[i].barriers++;
            }
        return true;
    }
    bool released = false;
    for (int w = 0; w * 32 < n; w++) {
        int first = -1;
        for (int l = 0; l < 32 && w * 32 + l < n; l++)
            if (rt.fibers[w * 32 + l].state == F_AT_WARP) {
                first = w * 32 + l;
                break;
            }
        if (first < 0) continue;
        unsigned mask = rt.fibers[first].wait_mask;
        bool all = true;
        for (int l = 0; l < 32; l++) {
            if (!(mask >> l & 1u)) continue;
            int i = w * 32 + l;
            if (i >= n || rt.fibers[i].state == F_DONE) {
                fail("a warp collective's mask names a thread that has exited or does not exist");
                return false;
            }
            if (rt.fibers[i].state != F_AT_WARP) all = false;
            else if (rt.fibers[i].wait_mask != mask) {
                fail("threads of one warp wait in warp collectives with different masks");
                return false;
            }
        }
        if (!all) continue;
        for (int l = 0; l < 32; l++)
            if (mask >> l & 1u) rt.fibers[w * 32 + l].state = F_RUN;
        released = true;
    }
    if (!released) fail("barrier divergence: a __syncthreads or warp collective that some threads never reach");
    return released;
}

bool run_block(int n, bool reverse)
{
    for (int i = 0; i < n; i++) {
        fiber &f = rt.fibers[i];
        getcontext(&f.uc);
        f.uc.uc_stack.ss_sp = f.stack;
        f.uc.uc_stack.ss_size = STACK_BYTES;
        f.uc.uc_link = nullptr;
        makecontext(&f.uc, trampoline, 0);
        f.state = F_RUN;
        f.wait_mask = 0;
        f.barriers = 0;
        f.pos.tid = make_uint3(i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y));
        f.pos.lane = i % 32;
        f.pos.warp = i / 32;
    }
    for (;;) {
        for (int j = 0; j < n; j++) {
            fiber &f = rt.fibers[reverse ? n - 1 - j : j];
            if (f.state == F_RUN) run_fiber(&f);
        }
        bool done = true;
        for (int i = 0; i < n; i++) done = done && rt.fibers[i].state == F_DONE;
        if (done) return true;
        if (!release_barriers(n)) return false;
    }
}

} // namespace

void sync_block()
{
    rt.running->state = F_AT_BLOCK;
    yield_to_scheduler(false);
}

void sync_warp(unsigned mask)
{
    if (!(mask >> cur->lane & 1u)) {
        fail("a warp collective's mask does not name the calling thread");
        mask |= 1u << cur->lane;
    }
    rt.running->state = F_AT_WARP;
    rt.running->wait_mask = mask;
    yield_to_scheduler(false);
}

uint64_t warp_exchange(unsigned mask, uint64_t mine, int src_lane)
{
    int w = cur->warp, lane = cur->lane;
    rt.slot[w][lane] = mine;
    sync_warp(mask);
    if (!(mask >> (src_lane & 31) & 1u)) fail("a shuffle reads a lane outside its mask");
    uint64_t v = rt.slot[w][src_lane & 31];
    sync_warp(mask); /* nobody overwrites a slot before every lane has read */
    return v;
}

unsigned warp_ballot(unsigned mask, int pred)
{
    int w = cur->warp, lane = cur->lane;
    rt.slot[w][lane] = pred != 0;
    sync_warp(mask);
    unsigned bits = 0;
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1u) && rt.slot[w][l]) bits |= 1u << l;
    sync_warp(mask);
    return bits;
}

void set_order_seed(uint64_t seed, bool invert)
{
    order_seed = seed;
    order_invert = invert;
    launches = single_launches = 0;
}

uint64_t single_block_launches() { return single_launches; }

void set_block_sample(int extra, uint64_t seed)
{
    sample_blocks = extra;
    sample_seed = seed;
}

int32_t launch(const char *name, dim3 grid, dim3 block, const std::function<void()> &fn)
{
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu ||
        threads == 0 || threads > MAX_THREADS || block.z > 64)
        return moe_errorf(NULL, MOE_ERR_BACKEND,
                          "kernel %s: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u)", name, grid.x,
                          grid.y, grid.z, block.x, block.y, block.z);
    if (rt.running) return moe_errorf(NULL, MOE_ERR_INTERNAL, "kernel %s: launched from inside a kernel", name);
    if (!ensure_fibers((int)threads))
        return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "kernel %s: no memory for simulated thread stacks", name);
    rt.body = &fn;
    rt.error = false;
    grid_dim = grid;
    block_dim = block;
    const uint64_t nblocks = (uint64_t)grid.x * grid.y * grid.z;
    const uint64_t flip = (mix(order_seed ^ mix(launches++)) & 1u) ^ (order_invert ? 1u : 0u);
    single_launches += nblocks == 1;
    /* the blocks that run: all, or (sampling) the first, the last and `sample_blocks` seeded ones in
     * increasing order (a seeded pick equal to another is skipped) */
    std::vector<uint64_t> run;
    const bool sampled = sample_blocks >= 0 && nblocks > (uint64_t)sample_blocks + 2;
    if (sampled) {
        run.push_back(0);
        for (int i = 0; i < sample_blocks; i++) run.push_back(mix(sample_seed ^ mix(launches * 1000003u + (uint64_t)i)) % nblocks);
        run.push_back(nblocks - 1);
        std::sort(run.begin(), run.end());
        run.erase(std::unique(run.begin(), run.end()), run.end());
    }
    const uint64_t count = sampled ? run.size() : nblocks;
    for (uint64_t j = 0; j < count; j++) {
        const uint64_t b = sampled ? run[j] : j;
        const unsigned x = (unsigned)(b % grid.x), y = (unsigned)(b / grid.x % grid.y),
                       z = (unsigned)(b / ((uint64_t)grid.x * grid.y));
        block_idx = make_uint3(x, y, z);
        if (!run_block((int)threads, ((b & 1) ^ flip) != 0) || rt.error) {
            cur = nullptr;
            rt.running = nullptr;
            return moe_errorf(NULL, MOE_ERR_INTERNAL, "kernel %s, block (%u,%u,%u): %s", name, x, y, z, rt.what);
        }
    }
    cur = nullptr;
    return MOE_OK;
}

} // namespace moe_sim

/* The C entry points (sim_backend.h). */
extern "C" void moe_sim_set_order_seed(uint64_t seed, int invert);
extern "C" void moe_sim_set_order_seed(uint64_t seed, int invert) { moe_sim::set_order_seed(seed, invert != 0); }
extern "C" uint64_t moe_sim_single_block_launches(void);
extern "C" uint64_t moe_sim_single_block_launches(void) { return moe_sim::single_block_launches(); }
extern "C" void moe_sim_set_block_sample(int extra, uint64_t seed);
extern "C" void moe_sim_set_block_sample(int extra, uint64_t seed) { moe_sim::set_block_sample(extra, seed); }

/*
 * The NCCL stand-in of the device simulator (devsim.h): the NCCL API of nccl.h for ranks that are
 * host threads of one process, each rank on its own simulated device. libmoe's NCCL communicator
 * (src/comm/comm_nccl.c) and the gpu tests link this instead of libnccl.
 *
 * The model:
 *  - communicators: ranks that pass the same ncclUniqueId meet in a process-wide registry; a
 *    non-blocking communicator (ncclConfig_t.blocking = 0) is ncclInProgress until every rank has
 *    joined, and ncclSystemError ("deadlock: ...") if they have not within devsim::deadlock_ms();
 *  - operations: every collective, send and receive is queued on the caller's stream with
 *    devsim::enqueue as a kernel (it is one in NCCL) and runs on that stream's worker thread. There
 *    the ranks meet: collective number i of every rank meets collective number i of the others (the
 *    number is taken when the operation runs on the stream, so that a captured graph replays
 *    correctly), send number k from rank a to rank b meets receive number k of b from a. Data are
 *    read from the peers' device buffers once all ranks are there and written only after every read
 *    (a two-phase rendezvous: in-place operations are safe); reductions run in rank order 0..n-1, so
 *    results are deterministic;
 *  - errors found while the operation runs (mismatched calls, a rank that never comes, an aborted
 *    peer) become the communicator's asynchronous error (ncclCommGetAsyncError): the operation
 *    completes, its receive buffers are left poisoned (0xFF bytes), nothing hangs;
 *  - strictness: the rule of "Using multiple NCCL communicators concurrently" is enforced at issue
 *    time (MOE_DEVSIM_NCCL_CONCURRENT=allow switches it off), and so is "Using the same CUDA device
 *    multiple times as different ranks of the same NCCL communicator is not supported"
 *    (MOE_DEVSIM_NCCL_SHARED_DEVICE=allow switches it off).
 * Not modelled: ncclCommInitRankScalable, ncclCommShrink/Revoke, buffer and window registration,
 * ncclRedOpCreatePreMulSum, all-to-all/gather/scatter, reductions of fp16/bf16/fp8 (they move data but
 * do not reduce: ncclInvalidArgument), ordering of one communicator's operations issued on several
 * unordered streams (NCCL orders them in issue order; here they are numbered in the order they run).
 *
 * Citations name the NCCL User Guide (docs.nvidia.com/deeplearning/nccl/user-guide), "UG <section>",
 * and the declarations' comments in nccl.h, "nccl.h <function>".
 */
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "devsim.h"

namespace devsim_nccl {

using Clock = std::chrono::steady_clock;

enum Kind { K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCESCATTER, K_SEND, K_RECV };

/* One operation as the rank issued it. */
struct Desc {
    Kind kind;
    const void *send;
    void *recv;
    size_t count; /* elements: per rank (all-gather: sendcount, reduce-scatter: recvcount) */
    ncclDataType_t dt;
    ncclRedOp_t op;
    int root;     /* broadcast, reduce */
    int peer;     /* send, recv */
};

struct Clique;
struct SplitSlot;

enum Pending { P_NONE, P_INIT, P_SPLIT, P_FINALIZE };

} // namespace devsim_nccl

/* The communicator object of one rank (nccl.h: typedef struct ncclComm *ncclComm_t). Guarded by
 * devsim_nccl::mu, like everything else here. */
struct ncclComm {
    std::shared_ptr<devsim_nccl::Clique> clique; /* null until the rank is placed (split) */
    int rank = -1, nranks = 0, device = 0;
    bool blocking = true;
    ncclResult_t state = ncclInProgress;         /* ncclCommGetAsyncError */
    std::string msg;                             /* why state is an error (ncclGetLastError) */
    bool aborted = false, finalized = false;
    int64_t in_flight = 0;                       /* queued (not captured) operations not yet run */
    devsim_nccl::Pending pending = devsim_nccl::P_NONE;
    devsim_nccl::Clock::time_point deadline;     /* of the pending init or split */
    std::shared_ptr<devsim_nccl::SplitSlot> split_wait;
    uint64_t coll_next = 0, split_next = 0;      /* numbers of this rank's operations */
    std::map<int, uint64_t> send_next, recv_next;
};

namespace devsim_nccl {

/* ---------------------------------------------------------------- shared state */
std::mutex mu;               /* everything below; never held while calling into devsim or CUDA */
std::condition_variable cv;  /* notified at every change a waiter may wait for */

struct CollSlot {
    std::vector<Desc> args;
    std::vector<char> present;
    int arrived = 0, departed = 0;
    bool computed = false, failed = false;
    ncclResult_t code = ncclSuccess;
    std::string msg;
    std::vector<unsigned char> result;
};

struct P2PSlot {
    bool has_send = false, has_recv = false;
    Desc send{}, recv{};
    bool done = false, failed = false;
    int departed = 0;
    ncclResult_t code = ncclSuccess;
    std::string msg;
};

struct SplitSlot {
    std::vector<char> present;
    std::vector<int> color, key;
    std::vector<std::shared_ptr<ncclComm>> parent, child;
    int arrived = 0;
    bool done = false, failed = false;
    std::string msg;
    uint64_t seq = 0;
};

struct Clique {
    std::string name;                      /* for messages */
    int nranks = 0, joined = 0;
    bool complete = false, failed = false;
    std::string fail_msg;
    std::vector<ncclComm *> members;       /* null once destroyed or aborted */
    std::vector<char> gone;                /* the rank aborted or destroyed its comm */
    std::map<uint64_t, std::shared_ptr<CollSlot>> coll;
    std::map<std::tuple<int, int, uint64_t>, std::shared_ptr<P2PSlot>> p2p;
    std::map<uint64_t, std::shared_ptr<SplitSlot>> splits;
};

std::map<std::string, std::shared_ptr<Clique>> init_registry; /* by unique id, while joining */
std::map<ncclComm *, std::shared_ptr<ncclComm>> live;         /* every usable handle */

/* ---------------------------------------------------------------- messages */
thread_local std::string t_last;   /* the calling thread's last error message */
thread_local std::string t_copy;   /* what ncclGetLastError returned */

std::string vformat(const char *fmt, va_list ap)
{
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    return buf;
}

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    std::string s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

void debug_warn(const std::string &m)
{
    if (getenv("NCCL_DEBUG")) fprintf(stderr, "devsim NCCL WARN %s\n", m.c_str());
}

/* An API error: the calling thread's last message, returned as r. */
ncclResult_t api_fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t api_fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    t_last = vformat(fmt, ap);
    va_end(ap);
    debug_warn(t_last);
    return r;
}

/* The comm's asynchronous error (the first one wins). Lock held. */
void set_async_locked(ncclComm *c, ncclResult_t r, const std::string &m)
{
    if (!c) return;
    if (c->state != ncclSuccess && c->state != ncclInProgress) return;
    c->state = r;
    c->msg = m;
    c->pending = P_NONE;
    debug_warn(m);
    cv.notify_all();
}

const char *type_name(ncclDataType_t t)
{
    static const char *n[] = {"int8",    "uint8",   "int32",    "uint32",      "int64",      "uint64",
                              "float16", "float32", "float64",  "bfloat16",    "float8e4m3", "float8e5m2"};
    return (int)t >= 0 && (int)t < ncclNumTypes ? n[(int)t] : "invalid type";
}

const char *op_name(ncclRedOp_t o)
{
    static const char *n[] = {"sum", "prod", "max", "min", "avg"};
    return (int)o >= 0 && (int)o < ncclNumOps ? n[(int)o] : "invalid op";
}

const char *kind_name(Kind k)
{
    static const char *n[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter",
                              "ncclSend", "ncclRecv"};
    return n[k];
}

bool is_reduction(Kind k) { return k == K_ALLREDUCE || k == K_REDUCE || k == K_REDUCESCATTER; }

std::string describe(const Desc &d)
{
    switch (d.kind) {
    case K_BROADCAST: return format("%s(count=%zu, %s, root=%d)", kind_name(d.kind), d.count, type_name(d.dt), d.root);
    case K_REDUCE:
        return format("%s(count=%zu, %s, %s, root=%d)", kind_name(d.kind), d.count, type_name(d.dt), op_name(d.op), d.root);
    case K_ALLGATHER: return format("%s(sendcount=%zu, %s)", kind_name(d.kind), d.count, type_name(d.dt));
    case K_REDUCESCATTER:
        return format("%s(recvcount=%zu, %s, %s)", kind_name(d.kind), d.count, type_name(d.dt), op_name(d.op));
    case K_SEND:
    case K_RECV: return format("%s(count=%zu, %s, peer=%d)", kind_name(d.kind), d.count, type_name(d.dt), d.peer);
    default: return format("%s(count=%zu, %s, %s)", kind_name(d.kind), d.count, type_name(d.dt), op_name(d.op));
    }
}

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
    }
}

/* Environment switches, read at every check (tests flip them while no rank runs). */
bool env_allows(const char *name)
{
    const char *v = getenv(name);
    return v && strcmp(v, "allow") == 0;
}

std::string missing_list(const std::vector<char> &present, const std::vector<char> *gone = nullptr)
{
    std::string s;
    for (size_t i = 0; i < present.size(); i++)
        if (!present[i] && (!gone || (*gone)[i])) s += (s.empty() ? "" : ", ") + std::to_string(i);
    return s;
}

/* ---------------------------------------------------------------- reductions */
template <class T> T combine(T a, T b, ncclRedOp_t op)
{
    switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return b > a ? b : a;
    case ncclMin: return b < a ? b : a;
    default: return a + b;
    }
}

/* Integer arithmetic wraps (as on the GPU) instead of overflowing. */
template <class T> T combine_int(T a, T b, ncclRedOp_t op)
{
    typedef typename std::make_unsigned<T>::type U;
    switch (op) {
    case ncclProd: return (T)(U)((U)a * (U)b);
    case ncclMax: return b > a ? b : a;
    case ncclMin: return b < a ? b : a;
    default: return (T)(U)((U)a + (U)b);
    }
}

template <class T, bool INT> void reduce_t(void *acc, const void *x, size_t n, ncclRedOp_t op)
{
    T *a = (T *)acc;
    const T *b = (const T *)x;
    for (size_t i = 0; i < n; i++) {
        T u, v;
        memcpy(&u, a + i, sizeof u);
        memcpy(&v, b + i, sizeof v);
        T r;
        if constexpr (INT) r = combine_int<T>(u, v, op);
        else r = combine<T>(u, v, op);
        memcpy(a + i, &r, sizeof r);
    }
}

template <class T> void average_t(void *acc, size_t n, int nranks)
{
    T *a = (T *)acc;
    for (size_t i = 0; i < n; i++) a[i] = (T)(a[i] / (T)nranks);
}

bool reducible(ncclDataType_t t)
{
    return t == ncclInt8 || t == ncclUint8 || t == ncclInt32 || t == ncclUint32 || t == ncclInt64 || t == ncclUint64 ||
           t == ncclFloat32 || t == ncclFloat64;
}

/* acc = acc (op) x, elementwise */
void reduce_into(void *acc, const void *x, size_t n, ncclDataType_t t, ncclRedOp_t op)
{
    switch (t) {
    case ncclInt8: reduce_t<int8_t, true>(acc, x, n, op); break;
    case ncclUint8: reduce_t<uint8_t, true>(acc, x, n, op); break;
    case ncclInt32: reduce_t<int32_t, true>(acc, x, n, op); break;
    case ncclUint32: reduce_t<uint32_t, true>(acc, x, n, op); break;
    case ncclInt64: reduce_t<int64_t, true>(acc, x, n, op); break;
    case ncclUint64: reduce_t<uint64_t, true>(acc, x, n, op); break;
    case ncclFloat32: reduce_t<float, false>(acc, x, n, op); break;
    case ncclFloat64: reduce_t<double, false>(acc, x, n, op); break;
    default: break;
    }
}

void average(void *acc, size_t n, ncclDataType_t t, int nranks)
{
    switch (t) {
    case ncclInt8: average_t<int8_t>(acc, n, nranks); break;
    case ncclUint8: average_t<uint8_t>(acc, n, nranks); break;
    case ncclInt32: average_t<int32_t>(acc, n, nranks); break;
    case ncclUint32: average_t<uint32_t>(acc, n, nranks); break;
    case ncclInt64: average_t<int64_t>(acc, n, nranks); break;
    case ncclUint64: average_t<uint64_t>(acc, n, nranks); break;
    case ncclFloat32: average_t<float>(acc, n, nranks); break;
    case ncclFloat64: average_t<double>(acc, n, nranks); break;
    default: break;
    }
}

/* ---------------------------------------------------------------- communicator helpers */
/* Places the joined ranks (lock held): ready, or the duplicate-device error. */
void complete_clique_locked(Clique &q)
{
    q.complete = true;
    std::string dup;
    /* UG "Creating a Communicator": "Using the same CUDA device multiple times as different ranks of
     * the same NCCL communicator is not supported and may lead to hangs." (NCCL's init fails with
     * ncclInvalidUsage, "Duplicate GPU detected".) */
    if (!env_allows("MOE_DEVSIM_NCCL_SHARED_DEVICE")) {
        for (int a = 0; a < q.nranks && dup.empty(); a++)
            for (int b = a + 1; b < q.nranks && dup.empty(); b++)
                if (q.members[a] && q.members[b] && q.members[a]->device == q.members[b]->device)
                    dup = format("Duplicate GPU detected: rank %d and rank %d of comm %s both on CUDA device %d (UG "
                                 "\"Creating a Communicator\": the same CUDA device as different ranks of one communicator "
                                 "is not supported; set MOE_DEVSIM_DEVICES or MOE_DEVSIM_NCCL_SHARED_DEVICE=allow)", a, b,
                                 q.name.c_str(), q.members[a]->device);
    }
    for (ncclComm *m : q.members) {
        if (!m) continue;
        if (!dup.empty()) {
            set_async_locked(m, ncclInvalidUsage, dup);
        } else if (m->state == ncclInProgress) {
            m->state = ncclSuccess;
            m->pending = P_NONE;
        }
    }
    cv.notify_all();
}

/* A join that did not complete in time (lock held): every joined rank fails. */
void fail_init_locked(Clique &q, const char *fn)
{
    if (q.complete || q.failed) return;
    q.failed = true;
    std::vector<char> present(q.members.size());
    for (size_t i = 0; i < present.size(); i++) present[i] = q.members[i] != nullptr;
    q.fail_msg = format("deadlock: %s of comm %s did not complete within MOE_DEVSIM_DEADLOCK_MS = %d ms: ranks %s never "
                        "arrived (%d of %d joined)", fn, q.name.c_str(), devsim::deadlock_ms(),
                        missing_list(present).c_str(), q.joined, q.nranks);
    for (ncclComm *m : q.members) set_async_locked(m, ncclSystemError, q.fail_msg);
}

void finish_split_locked(Clique &parent, SplitSlot &s)
{
    int n = (int)s.present.size();
    std::map<int, std::vector<std::pair<int, int>>> groups; /* color -> (key, old rank) */
    for (int r = 0; r < n; r++)
        if (s.color[r] != NCCL_SPLIT_NOCOLOR) groups[s.color[r]].push_back({s.key[r], r});
    for (auto &g : groups) {
        /* nccl.h ncclCommSplit: "Within the new communicator, key will be used to order ranks"; ties
         * keep the parent's order (as MPI_Comm_split). */
        std::sort(g.second.begin(), g.second.end());
        auto q = std::make_shared<Clique>();
        q->name = format("%s/split%llu.color%d", parent.name.c_str(), (unsigned long long)s.seq, g.first);
        q->nranks = (int)g.second.size();
        q->members.assign((size_t)q->nranks, nullptr);
        q->gone.assign((size_t)q->nranks, 0);
        for (int i = 0; i < q->nranks; i++) {
            ncclComm *c = s.child[(size_t)g.second[(size_t)i].second].get();
            c->rank = i;
            c->nranks = q->nranks;
            c->clique = q;
            c->split_wait.reset();
            if (!c->aborted) q->members[(size_t)i] = c;
            else q->gone[(size_t)i] = 1;
            q->joined++;
        }
        complete_clique_locked(*q);
    }
    for (auto &p : s.parent) {
        if (p && p->pending == P_SPLIT && p->state == ncclInProgress) {
            p->state = ncclSuccess;
            p->pending = P_NONE;
        }
        if (p) p->split_wait.reset();
    }
    s.done = true;
    cv.notify_all();
}

void fail_split_locked(SplitSlot &s)
{
    if (s.done || s.failed) return;
    s.failed = true;
    std::string who;
    for (size_t r = 0; r < s.present.size(); r++) who += s.present[r] ? "" : (who.empty() ? "" : ", ") + std::to_string(r);
    std::string name;
    for (auto &p : s.parent)
        if (p && p->clique) name = p->clique->name;
    s.msg = format("deadlock: ncclCommSplit #%llu on comm %s did not complete within MOE_DEVSIM_DEADLOCK_MS = %d ms: "
                   "parent ranks %s never called it (nccl.h ncclCommSplit: every rank of the parent must call it)",
                   (unsigned long long)s.seq, name.c_str(), devsim::deadlock_ms(), who.c_str());
    for (auto &p : s.parent) {
        if (!p) continue;
        if (p->pending == P_SPLIT) set_async_locked(p.get(), ncclSystemError, s.msg);
        p->split_wait.reset();
    }
    for (auto &c : s.child)
        if (c) set_async_locked(c.get(), ncclSystemError, s.msg);
}

/* Reports a pending init/split that ran out of time, finishes a quiet finalize (lock held). */
void refresh_locked(ncclComm *c)
{
    if (c->state != ncclInProgress) return;
    if (c->pending == P_FINALIZE) {
        if (c->in_flight == 0) {
            c->state = ncclSuccess;
            c->pending = P_NONE;
        }
        return;
    }
    if (Clock::now() < c->deadline) return;
    if (c->pending == P_INIT && c->clique) fail_init_locked(*c->clique, "ncclCommInitRank");
    else if (c->pending == P_SPLIT && c->split_wait) fail_split_locked(*c->split_wait);
}

/* Waits (lock held) until c leaves ncclInProgress or its deadline passes. */
void wait_ready_locked(std::unique_lock<std::mutex> &lk, ncclComm *c)
{
    while (c->state == ncclInProgress && c->pending != P_NONE) {
        if (c->pending == P_FINALIZE) {
            refresh_locked(c);
            if (c->state != ncclInProgress) break;
            cv.wait_for(lk, std::chrono::milliseconds(5));
            continue;
        }
        if (cv.wait_until(lk, c->deadline) == std::cv_status::timeout) refresh_locked(c);
    }
}

/* The live comm behind a handle, usable for a new operation (lock held). */
ncclResult_t usable_locked(ncclComm *h, const char *fn, std::shared_ptr<ncclComm> *out)
{
    if (!h) return api_fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    auto it = live.find(h);
    if (it == live.end())
        return api_fail(ncclInvalidUsage, "%s: comm %p is not a live communicator (destroyed or aborted)", fn, (void *)h);
    ncclComm *c = h;
    refresh_locked(c);
    if (c->finalized)
        return api_fail(ncclInvalidUsage, "%s: rank %d's comm was finalized (ncclCommFinalize); only ncclCommDestroy "
                        "may follow", fn, c->rank);
    /* UG "Creating a communicator with options" / ncclCommGetAsyncError: after a call returned
     * ncclInProgress, "users must query the communicator state until it becomes ncclSuccess before
     * calling another NCCL function" (NCCL: "Attempt to use communicator before the previous operation
     * returned ncclSuccess", ncclInvalidArgument). */
    if (c->state == ncclInProgress)
        return api_fail(ncclInvalidArgument, "%s: attempt to use communicator (rank %d) before the previous operation "
                        "returned ncclSuccess: poll ncclCommGetAsyncError until it leaves ncclInProgress", fn, c->rank);
    /* UG "Asynchronous errors and error handling": once a comm has an asynchronous error it must be
     * aborted; nothing can be assumed about operations issued after it. */
    if (c->state != ncclSuccess)
        return api_fail(c->state, "%s: rank %d's comm has an asynchronous error: %s", fn, c->rank, c->msg.c_str());
    *out = it->second;
    return ncclSuccess;
}

/* Switches the calling thread to device d and back (NCCL sets the comm's device itself). */
struct DeviceScope {
    int prev;
    bool switched;
    explicit DeviceScope(int d) : prev(devsim::current_device()), switched(prev != d)
    {
        if (switched) cudaSetDevice(d);
    }
    ~DeviceScope()
    {
        if (switched) cudaSetDevice(prev);
    }
};

ncclResult_t check_config(const ncclConfig_t *cfg, const char *fn, int *blocking)
{
    if (!cfg) return ncclSuccess;
    /* nccl.h NCCL_CONFIG_INITIALIZER: "Not initialized config will result in NCCL error." */
    if (cfg->magic != 0xcafebeef || cfg->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
        return api_fail(ncclInvalidArgument, "%s: config was not initialised with NCCL_CONFIG_INITIALIZER "
                        "(magic 0x%x, size %zu)", fn, cfg->magic, cfg->size);
    if (cfg->blocking != NCCL_CONFIG_UNDEF_INT) {
        if (cfg->blocking != 0 && cfg->blocking != 1)
            return api_fail(ncclInvalidArgument, "%s: config.blocking = %d; expected 0 or 1", fn, cfg->blocking);
        *blocking = cfg->blocking;
    }
    return ncclSuccess;
}

/* ---------------------------------------------------------------- groups */
struct Item {
    std::shared_ptr<ncclComm> comm;
    cudaStream_t stream;
    Desc d;
};

struct Group {
    int depth = 0;
    std::vector<Item> items;
    std::vector<std::shared_ptr<ncclComm>> waits; /* blocking inits/splits issued inside the group */
    bool nonblocking = false;                      /* a non-blocking comm took part */
    ncclResult_t first = ncclSuccess;              /* the first failure of a call inside the group */
    std::string first_msg;
};
thread_local Group t_group;

/* ---------------------------------------------------------------- the work on the stream */
/* Leaves what a failed operation would have written recognisably wrong (0xFF bytes). A reduce writes
 * recvbuff on the root only (nccl.h ncclReduce: "recvbuff may be NULL on all calls except for root
 * device"). */
void poison(const Desc &d, int nranks, int rank)
{
    size_t es = type_size(d.dt), bytes = 0;
    switch (d.kind) {
    case K_REDUCE: bytes = rank == d.root ? d.count * es : 0; break;
    case K_ALLGATHER: bytes = d.count * es * (size_t)nranks; break;
    case K_SEND: bytes = 0; break;
    default: bytes = d.count * es;
    }
    if (d.recv && bytes) memset(d.recv, 0xFF, bytes);
}

bool same_call(const Desc &a, const Desc &b)
{
    if (a.kind != b.kind || a.count != b.count || a.dt != b.dt) return false;
    if (is_reduction(a.kind) && a.op != b.op) return false;
    if ((a.kind == K_BROADCAST || a.kind == K_REDUCE) && a.root != b.root) return false;
    return true;
}

/* All ranks are in the slot: every read happens here, before any rank writes (lock held). */
void compute_locked(CollSlot &s, int n)
{
    const Desc &d0 = s.args[0];
    size_t es = type_size(d0.dt), bytes = d0.count * es;
    switch (d0.kind) {
    case K_BROADCAST:
        s.result.assign((const unsigned char *)s.args[(size_t)d0.root].send,
                        (const unsigned char *)s.args[(size_t)d0.root].send + bytes);
        break;
    case K_ALLGATHER:
        s.result.resize(bytes * (size_t)n);
        for (int r = 0; r < n; r++)
            if (bytes) memcpy(s.result.data() + (size_t)r * bytes, s.args[(size_t)r].send, bytes);
        break;
    default: { /* all-reduce, reduce, reduce-scatter: in rank order 0..n-1 */
        size_t elems = d0.kind == K_REDUCESCATTER ? d0.count * (size_t)n : d0.count;
        s.result.resize(elems * es);
        memcpy(s.result.data(), s.args[0].send, elems * es);
        for (int r = 1; r < n; r++) reduce_into(s.result.data(), s.args[(size_t)r].send, elems, d0.dt, d0.op);
        if (d0.op == ncclAvg) average(s.result.data(), elems, d0.dt, n);
    }
    }
    s.computed = true;
}

void copy_out(const CollSlot &s, const Desc &d, int rank)
{
    size_t es = type_size(d.dt), bytes = d.count * es;
    switch (d.kind) {
    case K_REDUCE:
        if (rank == d.root && bytes) memcpy(d.recv, s.result.data(), bytes);
        break;
    case K_ALLGATHER:
        if (!s.result.empty()) memcpy(d.recv, s.result.data(), s.result.size());
        break;
    case K_REDUCESCATTER:
        if (bytes) memcpy(d.recv, s.result.data() + (size_t)rank * bytes, bytes);
        break;
    default:
        if (bytes) memcpy(d.recv, s.result.data(), bytes);
    }
}

void fail_slot_locked(Clique &q, CollSlot &s, ncclResult_t code, const std::string &m)
{
    s.failed = true;
    s.code = code;
    s.msg = m;
    for (size_t r = 0; r < s.present.size(); r++)
        if (s.present[r]) set_async_locked(q.members[r], code, m);
    cv.notify_all();
}

/* Collective number seq of rank c->rank (runs on the rank's stream worker). */
void run_collective(const std::shared_ptr<ncclComm> &cp, uint64_t seq, const Desc &d)
{
    ncclComm *c = cp.get();
    std::unique_lock<std::mutex> lk(mu);
    Clique &q = *c->clique;
    int n = q.nranks, me = c->rank;
    auto &sp = q.coll[seq];
    if (!sp) {
        sp = std::make_shared<CollSlot>();
        sp->args.resize((size_t)n);
        sp->present.assign((size_t)n, 0);
    }
    std::shared_ptr<CollSlot> s = sp;
    auto depart = [&] {
        if (++s->departed == n) q.coll.erase(seq);
    };
    if (c->aborted) { /* UG "ncclCommAbort": operations of an aborted comm are cancelled */
        if (!s->failed)
            fail_slot_locked(q, *s, ncclRemoteError, format("rank %d aborted comm %s before %s #%llu", me, q.name.c_str(),
                                                            kind_name(d.kind), (unsigned long long)seq));
        depart();
        return;
    }
    if (s->failed) { /* the peers already gave up on this operation */
        set_async_locked(c, s->code, s->msg);
        poison(d, n, me);
        depart();
        return;
    }
    s->args[(size_t)me] = d;
    s->present[(size_t)me] = 1;
    if (++s->arrived == n) {
        /* nccl.h "Collective communication operations must be called separately for each communicator
         * in a communicator clique", with the same arguments: UG "Collective Operations" (count,
         * datatype, op and root agree on every rank). A mismatch hangs or corrupts in NCCL. */
        int bad = -1;
        for (int r = 1; r < n && bad < 0; r++)
            if (!same_call(s->args[(size_t)r], s->args[0])) bad = r;
        if (bad >= 0)
            fail_slot_locked(q, *s, ncclInvalidUsage,
                             format("mismatched collective #%llu on comm %s: rank 0 called %s, rank %d called %s (UG "
                                    "\"Collective Operations\": every rank must make the same call)",
                                    (unsigned long long)seq, q.name.c_str(), describe(s->args[0]).c_str(), bad,
                                    describe(s->args[(size_t)bad]).c_str()));
        else
            compute_locked(*s, n);
        cv.notify_all();
    } else {
        auto deadline = Clock::now() + std::chrono::milliseconds(devsim::deadlock_ms());
        for (;;) {
            if (s->computed || s->failed) break;
            if (c->aborted) {
                fail_slot_locked(q, *s, ncclRemoteError, format("rank %d aborted comm %s while waiting in %s #%llu", me,
                                                                q.name.c_str(), kind_name(d.kind),
                                                                (unsigned long long)seq));
                depart();
                return;
            }
            std::string gone = missing_list(s->present, &q.gone);
            if (!gone.empty()) {
                fail_slot_locked(q, *s, ncclRemoteError,
                                 format("rank %d waits in %s #%llu on comm %s, but ranks %s aborted or destroyed their comm",
                                        me, kind_name(d.kind), (unsigned long long)seq, q.name.c_str(), gone.c_str()));
                break;
            }
            if (cv.wait_until(lk, deadline) == std::cv_status::timeout && !s->computed && !s->failed) {
                fail_slot_locked(q, *s, ncclSystemError,
                                 format("deadlock: rank %d waits in %s #%llu on comm %s, ranks %s never arrived (within "
                                        "MOE_DEVSIM_DEADLOCK_MS = %d ms)", me, kind_name(d.kind), (unsigned long long)seq,
                                        q.name.c_str(), missing_list(s->present).c_str(), devsim::deadlock_ms()));
                break;
            }
        }
    }
    if (s->failed) {
        poison(d, n, me);
        depart();
        return;
    }
    lk.unlock();
    copy_out(*s, d, me); /* the result is immutable once computed */
    lk.lock();
    depart();
}

/* Posts this rank's side of a send or receive; matches it when both are there (lock held). */
void post_p2p_locked(ncclComm *c, const std::tuple<int, int, uint64_t> &key, const Desc &d,
                     std::vector<std::pair<std::tuple<int, int, uint64_t>, std::shared_ptr<P2PSlot>>> &mine)
{
    Clique &q = *c->clique;
    auto &sp = q.p2p[key];
    if (!sp) sp = std::make_shared<P2PSlot>();
    std::shared_ptr<P2PSlot> s = sp;
    mine.push_back({key, s});
    if (s->failed) return;
    if (d.kind == K_SEND) {
        s->has_send = true;
        s->send = d;
    } else {
        s->has_recv = true;
        s->recv = d;
    }
    if (!(s->has_send && s->has_recv)) return;
    int src = std::get<0>(key), dst = std::get<1>(key);
    /* nccl.h ncclSend: "Rank peer needs to call ncclRecv with the same datatype and the same count
     * from this rank." */
    if (s->send.count != s->recv.count || s->send.dt != s->recv.dt) {
        s->failed = true;
        s->code = ncclInvalidUsage;
        s->msg = format("mismatched point-to-point #%llu on comm %s: rank %d called ncclSend(count=%zu, %s, peer=%d), "
                        "rank %d called ncclRecv(count=%zu, %s, peer=%d) (nccl.h ncclSend: same datatype and count)",
                        (unsigned long long)std::get<2>(key), q.name.c_str(), src, s->send.count,
                        type_name(s->send.dt), dst, dst, s->recv.count, type_name(s->recv.dt), src);
        set_async_locked(q.members[(size_t)src], s->code, s->msg);
        set_async_locked(q.members[(size_t)dst], s->code, s->msg);
        poison(s->recv, q.nranks, dst);
    } else {
        size_t bytes = s->send.count * type_size(s->send.dt);
        if (bytes) memmove(s->recv.recv, s->send.send, bytes); /* the sender waits until done */
        s->done = true;
    }
    cv.notify_all();
}

/* One launch of a rank: its operations on one comm and stream, in issue order (a group, or one call). */
void run_batch(const std::shared_ptr<ncclComm> &cp, const std::vector<Desc> &items)
{
    ncclComm *c = cp.get();
    std::vector<std::pair<uint64_t, Desc>> colls;
    std::vector<std::pair<std::tuple<int, int, uint64_t>, std::shared_ptr<P2PSlot>>> mine;
    std::vector<Desc> p2p_desc;
    {
        std::lock_guard<std::mutex> g(mu);
        if (c->aborted || !c->clique) return;
        /* UG "Group Calls" / nccl.h ncclSend: sends and receives of one group progress concurrently;
         * all of them are posted before this rank waits for any. */
        for (const Desc &d : items) {
            if (d.kind == K_SEND) {
                post_p2p_locked(c, std::make_tuple(c->rank, d.peer, c->send_next[d.peer]++), d, mine);
                p2p_desc.push_back(d);
            } else if (d.kind == K_RECV) {
                post_p2p_locked(c, std::make_tuple(d.peer, c->rank, c->recv_next[d.peer]++), d, mine);
                p2p_desc.push_back(d);
            } else {
                colls.push_back({c->coll_next++, d});
            }
        }
    }
    for (auto &cd : colls) run_collective(cp, cd.first, cd.second);
    if (mine.empty()) return;
    std::unique_lock<std::mutex> lk(mu);
    Clique &q = *c->clique;
    auto deadline = Clock::now() + std::chrono::milliseconds(devsim::deadlock_ms());
    for (size_t i = 0; i < mine.size(); i++) {
        P2PSlot &s = *mine[i].second;
        const Desc &d = p2p_desc[i];
        int src = std::get<0>(mine[i].first), dst = std::get<1>(mine[i].first);
        int other = d.kind == K_SEND ? dst : src;
        const char *missing = d.kind == K_SEND ? "ncclRecv" : "ncclSend";
        for (;;) {
            if (s.done || s.failed) break;
            if (c->aborted) {
                s.failed = true;
                s.code = ncclRemoteError;
                s.msg = format("rank %d aborted comm %s while waiting in %s to rank %d", c->rank, q.name.c_str(),
                               kind_name(d.kind), other);
                set_async_locked(q.members[(size_t)other], s.code, s.msg);
                cv.notify_all();
                break;
            }
            if (q.gone[(size_t)other]) {
                s.failed = true;
                s.code = ncclRemoteError;
                s.msg = format("rank %d waits in %s #%llu with peer %d on comm %s, but rank %d aborted or destroyed its comm",
                               c->rank, kind_name(d.kind), (unsigned long long)std::get<2>(mine[i].first), other,
                               q.name.c_str(), other);
                break;
            }
            if (cv.wait_until(lk, deadline) == std::cv_status::timeout && !s.done && !s.failed) {
                s.failed = true;
                s.code = ncclSystemError;
                s.msg = format("deadlock: rank %d waits in %s #%llu with peer %d on comm %s, ranks %d never arrived (no "
                               "matching %s within MOE_DEVSIM_DEADLOCK_MS = %d ms; nccl.h ncclSend: sends and receives "
                               "that must progress together belong in one ncclGroupStart/ncclGroupEnd)",
                               c->rank, kind_name(d.kind), (unsigned long long)std::get<2>(mine[i].first), other,
                               q.name.c_str(), other, missing, devsim::deadlock_ms());
                cv.notify_all();
                break;
            }
        }
        if (s.failed) {
            if (!c->aborted) {
                set_async_locked(c, s.code, s.msg);
                if (d.kind == K_RECV) poison(d, q.nranks, c->rank);
            }
        }
        /* forget the slot once both sides are through with it (a failed slot whose peer never came
         * stays, so that a late peer fails at once instead of waiting again) */
        if (++s.departed == 2) {
            auto it = q.p2p.find(mine[i].first);
            if (it != q.p2p.end() && it->second.get() == &s) q.p2p.erase(it);
        }
    }
}

/* ---------------------------------------------------------------- launching */
struct Batch {
    std::shared_ptr<ncclComm> comm;
    cudaStream_t stream;
    std::vector<Desc> items;
};

ncclResult_t launch(std::vector<Item> &items)
{
    std::vector<Batch> batches;
    for (Item &it : items) {
        Batch *b = nullptr;
        for (Batch &x : batches)
            if (x.comm == it.comm && x.stream == it.stream) b = &x;
        if (!b) {
            batches.push_back({it.comm, it.stream, {}});
            b = &batches.back();
        }
        b->items.push_back(it.d);
    }
    {
        std::lock_guard<std::mutex> g(mu);
        for (Batch &b : batches) {
            ncclComm *c = b.comm.get();
            if (!live.count(c) || c->aborted)
                return api_fail(ncclInvalidUsage, "ncclGroupEnd: a comm of the group was destroyed or aborted before "
                                "the group was launched");
            if (c->state != ncclSuccess)
                return api_fail(c->state == ncclInProgress ? ncclInvalidArgument : c->state,
                                "ncclGroupEnd: rank %d's comm is %s: %s", c->rank,
                                c->state == ncclInProgress ? "not ready" : "in error", c->msg.c_str());
            if (env_allows("MOE_DEVSIM_NCCL_CONCURRENT")) continue;
            /* UG "Using multiple NCCL communicators concurrently": "Using multiple NCCL communicators
             * requires careful synchronization, or can lead to deadlocks. NCCL kernels are blocking
             * (waiting for data to arrive), and any CUDA operation can cause a device synchronization
             * [...]. Operations on different communicators should therefore be used at different epochs
             * with a locking mechanism, and applications should ensure operations are submitted in the
             * same order across ranks." Enforced strictly: no operation may be issued on a comm of a
             * device while an operation issued earlier on another comm of that device is in flight. */
            for (auto &kv : live) {
                ncclComm *o = kv.first;
                if (o->device != c->device || o->clique == c->clique || o->in_flight == 0) continue;
                bool in_group = false;
                for (Batch &x : batches) in_group |= x.comm.get() == o;
                if (in_group) continue;
                return api_fail(ncclInvalidUsage,
                                "%s on comm %s (rank %d, device %d) issued while %lld operation(s) issued earlier on "
                                "another communicator of device %d (comm %s, rank %d) have not completed: NCCL User Guide "
                                "\"Using multiple NCCL communicators concurrently\": operations on different communicators "
                                "must be used at different epochs (wait for one comm's operations to complete before "
                                "issuing on another); MOE_DEVSIM_NCCL_CONCURRENT=allow disables this check",
                                kind_name(b.items[0].kind), c->clique->name.c_str(), c->rank, c->device,
                                (long long)o->in_flight, c->device, o->clique ? o->clique->name.c_str() : "?", o->rank);
            }
        }
    }
    for (Batch &b : batches) {
        std::shared_ptr<ncclComm> cp = b.comm;
        DeviceScope ds(cp->device);
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(b.stream, &cs) != cudaSuccess) cs = cudaStreamCaptureStatusNone;
        /* UG "Using NCCL with CUDA Graphs": captured operations run at every graph launch; the lambda
         * holds its arguments by value and numbers the operation when it runs. */
        bool counted = cs == cudaStreamCaptureStatusNone;
        if (counted) {
            std::lock_guard<std::mutex> g(mu);
            cp->in_flight++;
        }
        std::vector<Desc> its = b.items;
        const char *what = its.size() == 1 ? kind_name(its[0].kind) : "ncclGroupEnd (fused NCCL operations)";
        cudaError_t e = devsim::enqueue(b.stream, what, [cp, its, counted]() -> cudaError_t {
            run_batch(cp, its);
            if (counted) {
                std::lock_guard<std::mutex> g(mu);
                cp->in_flight--;
                cv.notify_all();
            }
            return cudaSuccess;
        }, devsim::ENQ_KERNEL);
        if (e != cudaSuccess) {
            if (counted) {
                std::lock_guard<std::mutex> g(mu);
                cp->in_flight--;
            }
            /* UG "CUDA Stream Semantics": the call returns once the operation is enqueued, or an error */
            return api_fail(ncclUnhandledCudaError, "%s: enqueueing on the stream failed: %s (%s)", what,
                            cudaGetErrorString(e), cudaGetErrorName(e));
        }
    }
    return ncclSuccess;
}

/* A data call: validated, then added to the thread's group or launched at once. */
ncclResult_t issue(Desc d, ncclComm_t comm, cudaStream_t stream)
{
    const char *fn = kind_name(d.kind);
    std::shared_ptr<ncclComm> cp;
    ncclResult_t r;
    {
        std::lock_guard<std::mutex> g(mu);
        r = usable_locked(comm, fn, &cp);
    }
    if (r != ncclSuccess) goto failed;
    {
        ncclComm *c = cp.get();
        int n = c->nranks;
        /* UG "Types" / nccl.h: ncclDataType_t and ncclRedOp_t values; others are invalid arguments */
        if ((int)d.dt < 0 || (int)d.dt >= ncclNumTypes) {
            r = api_fail(ncclInvalidArgument, "%s: invalid datatype %d", fn, (int)d.dt);
            goto failed;
        }
        if (is_reduction(d.kind)) {
            if ((int)d.op < 0 || (int)d.op >= ncclNumOps) {
                r = api_fail(ncclInvalidArgument, "%s: invalid or unsupported reduction op %d (the simulator has no "
                             "ncclRedOpCreatePreMulSum)", fn, (int)d.op);
                goto failed;
            }
            if (!reducible(d.dt)) {
                r = api_fail(ncclInvalidArgument, "%s: the device simulator does not reduce %s (a simulator limit, not "
                             "an NCCL rule)", fn, type_name(d.dt));
                goto failed;
            }
        }
        /* nccl.h ncclBroadcast/ncclReduce: "root is the rank (not the CUDA device)"; ncclSend: peer */
        if ((d.kind == K_BROADCAST || d.kind == K_REDUCE) && (d.root < 0 || d.root >= n)) {
            r = api_fail(ncclInvalidArgument, "%s: root %d is not a rank of the comm (nranks %d)", fn, d.root, n);
            goto failed;
        }
        if ((d.kind == K_SEND || d.kind == K_RECV) && (d.peer < 0 || d.peer >= n)) {
            r = api_fail(ncclInvalidArgument, "%s: peer %d is not a rank of the comm (nranks %d)", fn, d.peer, n);
            goto failed;
        }
        if (d.count == 0) return ncclSuccess; /* NCCL drops empty operations */
        /* UG "Data Pointers": buffers must be device memory of the comm's device (or registered /
         * managed memory, which the simulator does not have); the count covers them. */
        size_t es = type_size(d.dt), one = d.count * es, all = one * (size_t)n;
        struct Need { const void *p; size_t bytes; const char *name; };
        std::vector<Need> need;
        /* push_back, not list assignment: GCC 12's -Wnonnull misfires on the latter at -O2 */
        switch (d.kind) {
        case K_ALLREDUCE:
            need.push_back({d.send, one, "sendbuff"});
            need.push_back({d.recv, one, "recvbuff"});
            break;
        case K_BROADCAST:
            need.push_back({d.recv, one, "recvbuff"});
            if (c->rank == d.root) need.push_back({d.send, one, "sendbuff"});
            break;
        case K_REDUCE: /* nccl.h ncclReduce: "recvbuff may be NULL on all calls except for root device" */
            need.push_back({d.send, one, "sendbuff"});
            if (c->rank == d.root) need.push_back({d.recv, one, "recvbuff"});
            break;
        case K_ALLGATHER:
            need.push_back({d.send, one, "sendbuff"});
            need.push_back({d.recv, all, "recvbuff"});
            break;
        case K_REDUCESCATTER:
            need.push_back({d.send, all, "sendbuff"});
            need.push_back({d.recv, one, "recvbuff"});
            break;
        case K_SEND: need.push_back({d.send, one, "sendbuff"}); break;
        case K_RECV: need.push_back({d.recv, one, "recvbuff"}); break;
        }
        for (const Need &x : need) {
            devsim::MemInfo mi = devsim::lookup(x.p, x.bytes);
            if (!x.p || mi.kind != devsim::MEM_DEVICE || mi.device != c->device) {
                r = api_fail(ncclInvalidArgument, "%s: %s %p (%zu bytes) is not %s: %s (UG \"Data Pointers\")", fn,
                             x.name, x.p, x.bytes,
                             format("device memory of the comm's device %d", c->device).c_str(),
                             !x.p ? "NULL" : mi.kind == devsim::MEM_DEVICE ? format("device memory of device %d", mi.device).c_str()
                             : mi.kind == devsim::MEM_PINNED_HOST ? "pinned host memory"
                             : devsim::lookup(x.p, 0).kind == devsim::MEM_DEVICE ? "past the end of its device allocation"
                                                                                 : "host memory");
                goto failed;
            }
        }
        /* UG "CUDA Stream Semantics": the operation runs on the given stream of the comm's device */
        {
            DeviceScope ds(c->device);
            devsim::Stream *s = nullptr;
            cudaError_t e = devsim::resolve(stream, &s);
            if (e != cudaSuccess) {
                r = api_fail(ncclInvalidArgument, "%s: stream %p is not a live stream (%s)", fn, (void *)stream,
                             cudaGetErrorString(e));
                goto failed;
            }
            if (devsim::stream_device(s) != c->device) {
                r = api_fail(ncclInvalidArgument, "%s: stream %p belongs to device %d, the comm (rank %d) to device %d", fn,
                             (void *)stream, devsim::stream_device(s), c->rank, c->device);
                goto failed;
            }
        }
        if (devsim::fault("collective")) {
            r = api_fail(ncclUnhandledCudaError, "%s: injected fault (moe_devsim_fault_at(\"collective\"))", fn);
            goto failed;
        }
        if (t_group.depth > 0) {
            t_group.items.push_back({cp, stream, d});
            t_group.nonblocking |= !c->blocking;
            return ncclSuccess;
        }
        std::vector<Item> one_item{{cp, stream, d}};
        r = launch(one_item);
        if (r != ncclSuccess) goto failed;
        /* UG "Nonblocking Group Operation": a call on a non-blocking comm may return ncclInProgress */
        return c->blocking ? ncclSuccess : ncclInProgress;
    }
failed:
    /* nccl.h ncclGroupEnd: a call failing inside a group fails the group (nothing of it is launched) */
    if (t_group.depth > 0 && t_group.first == ncclSuccess) {
        t_group.first = r;
        t_group.first_msg = t_last;
    }
    return r;
}

/* ---------------------------------------------------------------- unique ids */
const char ID_MAGIC[8] = {'d', 'e', 'v', 's', 'i', 'm', 'N', 'C'};

std::string id_name(const ncclUniqueId &id)
{
    uint32_t pid;
    uint64_t counter;
    memcpy(&pid, id.internal + 8, sizeof pid);
    memcpy(&counter, id.internal + 12, sizeof counter);
    return format("%u.%llu", pid, (unsigned long long)counter);
}

} // namespace devsim_nccl

using namespace devsim_nccl;

/* ================================================================ the API */
extern "C" {

ncclResult_t ncclGetVersion(int *version)
{
    if (!version) return api_fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

/* UG API ncclGetLastError: "Returns a human-readable string corresponding to the last error that
 * occurred in NCCL"; here the comm's asynchronous error when it has one, else the calling thread's
 * last API error. */
const char *ncclGetLastError(ncclComm_t comm)
{
    std::lock_guard<std::mutex> g(mu);
    auto it = comm ? live.find(comm) : live.end();
    if (it != live.end() && comm->state != ncclSuccess && comm->state != ncclInProgress && !comm->msg.empty())
        t_copy = comm->msg;
    else
        t_copy = t_last;
    return t_copy.c_str();
}

/* nccl.h ncclGetUniqueId: an id per communicator; unique per call (pid, counter, random bytes). */
ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id) return api_fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    static std::mutex id_mu;
    static uint64_t counter = 0;
    static std::mt19937_64 rng{std::random_device{}()};
    memset(id->internal, 0, sizeof id->internal);
    std::lock_guard<std::mutex> g(id_mu);
    uint32_t pid = (uint32_t)getpid();
    uint64_t k = ++counter;
    memcpy(id->internal, ID_MAGIC, sizeof ID_MAGIC);
    memcpy(id->internal + 8, &pid, sizeof pid);
    memcpy(id->internal + 12, &k, sizeof k);
    for (int i = 0; i < 4; i++) {
        uint64_t x = rng();
        memcpy(id->internal + 20 + 8 * i, &x, sizeof x);
    }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *newcomm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config)
{
    const char *fn = "ncclCommInitRank";
    if (!newcomm) return api_fail(ncclInvalidArgument, "%s: newcomm is NULL", fn);
    int blocking = 1;
    ncclResult_t r = check_config(config, fn, &blocking);
    if (r != ncclSuccess) return r;
    /* nccl.h ncclCommInitRank: "rank must be between 0 and nranks-1" */
    if (nranks < 1) return api_fail(ncclInvalidArgument, "%s: nranks = %d; expected >= 1", fn, nranks);
    if (rank < 0 || rank >= nranks)
        return api_fail(ncclInvalidArgument, "%s: rank = %d; expected 0 <= rank < nranks = %d", fn, rank, nranks);
    if (memcmp(commId.internal, ID_MAGIC, sizeof ID_MAGIC) != 0)
        return api_fail(ncclInvalidArgument, "%s: commId did not come from ncclGetUniqueId", fn);
    if (devsim::fault("comm_init"))
        return api_fail(ncclSystemError, "%s: injected fault (moe_devsim_fault_at(\"comm_init\"))", fn);
    /* nccl.h ncclCommInitRank: "Each rank is associated to a CUDA device, which has to be set before
     * calling ncclCommInitRank." */
    auto c = std::make_shared<ncclComm>();
    c->rank = rank;
    c->nranks = nranks;
    c->device = devsim::current_device();
    c->blocking = blocking != 0;
    c->state = ncclInProgress;
    c->pending = P_INIT;
    c->deadline = Clock::now() + std::chrono::milliseconds(devsim::deadlock_ms());
    std::unique_lock<std::mutex> lk(mu);
    std::string key(commId.internal, sizeof commId.internal);
    auto &qp = init_registry[key];
    if (!qp) {
        qp = std::make_shared<Clique>();
        qp->name = id_name(commId);
        qp->nranks = nranks;
        qp->members.assign((size_t)nranks, nullptr);
        qp->gone.assign((size_t)nranks, 0);
    }
    std::shared_ptr<Clique> q = qp;
    if (q->failed)
        return api_fail(ncclSystemError, "%s: rank %d joins comm %s, whose initialisation already failed: %s", fn, rank,
                        q->name.c_str(), q->fail_msg.c_str());
    if (q->nranks != nranks)
        return api_fail(ncclInvalidArgument, "%s: rank %d passes nranks = %d for comm %s, which other ranks created with "
                        "nranks = %d", fn, rank, nranks, q->name.c_str(), q->nranks);
    /* nccl.h ncclCommInitRank: rank "unique within a communicator clique" */
    if (q->members[(size_t)rank] || q->gone[(size_t)rank])
        return api_fail(ncclInvalidUsage, "%s: rank %d of comm %s joined twice", fn, rank, q->name.c_str());
    q->members[(size_t)rank] = c.get();
    c->clique = q;
    live[c.get()] = c;
    *newcomm = c.get();
    if (++q->joined == q->nranks) {
        complete_clique_locked(*q);
        init_registry.erase(key);
    }
    /* nccl.h "Group semantics": ncclCommInitRank inside a group returns at once; ncclGroupEnd waits */
    if (t_group.depth > 0) {
        if (c->blocking) t_group.waits.push_back(c);
        else t_group.nonblocking = true;
        return ncclSuccess;
    }
    /* UG "Creating a communicator with options": with blocking = 0 the call returns ncclInProgress and
     * the state is polled with ncclCommGetAsyncError */
    if (!c->blocking) return ncclInProgress;
    wait_ready_locked(lk, c.get());
    if (c->state != ncclSuccess) {
        t_last = c->msg;
        return c->state;
    }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (!comms || ndev < 1) return api_fail(ncclInvalidArgument, "ncclCommInitAll: comms is NULL or ndev < 1");
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    int prev = devsim::current_device();
    ncclGroupStart();
    ncclResult_t first = ncclSuccess;
    for (int i = 0; i < ndev; i++) {
        cudaSetDevice(devlist ? devlist[i] : i);
        ncclResult_t r = ncclCommInitRank(comms + i, ndev, id, i);
        if (first == ncclSuccess) first = r;
    }
    ncclResult_t r = ncclGroupEnd();
    cudaSetDevice(prev);
    return first != ncclSuccess ? first : r;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    const char *fn = "ncclCommSplit";
    if (!newcomm) return api_fail(ncclInvalidArgument, "%s: newcomm is NULL", fn);
    std::shared_ptr<ncclComm> pp;
    {
        std::lock_guard<std::mutex> g(mu);
        ncclResult_t r = usable_locked(comm, fn, &pp);
        if (r != ncclSuccess) return r;
    }
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return api_fail(ncclInvalidArgument, "%s: color = %d; expected >= 0 or NCCL_SPLIT_NOCOLOR", fn, color);
    /* nccl.h ncclCommSplit: "If config is NULL, the new communicator will inherit the original
     * communicator's configuration" */
    int blocking = pp->blocking ? 1 : 0;
    ncclResult_t r = check_config(config, fn, &blocking);
    if (r != ncclSuccess) return r;
    if (devsim::fault("comm_init"))
        return api_fail(ncclSystemError, "%s: injected fault (moe_devsim_fault_at(\"comm_init\"))", fn);
    *newcomm = nullptr;
    std::shared_ptr<ncclComm> child;
    auto deadline = Clock::now() + std::chrono::milliseconds(devsim::deadlock_ms());
    if (color != NCCL_SPLIT_NOCOLOR) {
        child = std::make_shared<ncclComm>();
        child->device = pp->device;
        child->blocking = blocking != 0;
        child->state = ncclInProgress;
        child->pending = P_SPLIT;
        child->deadline = deadline;
    }
    std::unique_lock<std::mutex> lk(mu);
    ncclComm *p = pp.get();
    Clique &q = *p->clique;
    uint64_t seq = p->split_next++;
    auto &sp = q.splits[seq];
    if (!sp) {
        sp = std::make_shared<SplitSlot>();
        sp->seq = seq;
        sp->present.assign((size_t)q.nranks, 0);
        sp->color.assign((size_t)q.nranks, NCCL_SPLIT_NOCOLOR);
        sp->key.assign((size_t)q.nranks, 0);
        sp->parent.resize((size_t)q.nranks);
        sp->child.resize((size_t)q.nranks);
    }
    std::shared_ptr<SplitSlot> s = sp;
    if (s->failed) return api_fail(ncclSystemError, "%s: %s", fn, s->msg.c_str());
    /* nccl.h ncclCommSplit: every rank of the parent calls it (ranks that stay out pass
     * NCCL_SPLIT_NOCOLOR and get a NULL communicator) */
    s->present[(size_t)p->rank] = 1;
    s->color[(size_t)p->rank] = color;
    s->key[(size_t)p->rank] = key;
    s->parent[(size_t)p->rank] = pp;
    s->child[(size_t)p->rank] = child;
    if (child) {
        live[child.get()] = child;
        child->split_wait = s;
        *newcomm = child.get();
    }
    bool nb = !blocking;
    if (nb) { /* the parent is busy with the split until it completes (polled like the child) */
        p->state = ncclInProgress;
        p->pending = P_SPLIT;
        p->deadline = deadline;
        p->split_wait = s;
    }
    if (++s->arrived == q.nranks) {
        finish_split_locked(q, *s);
        q.splits.erase(seq);
    }
    if (t_group.depth > 0) {
        if (nb) t_group.nonblocking = true;
        else if (child) t_group.waits.push_back(child);
        return ncclSuccess;
    }
    if (nb) return ncclInProgress;
    while (!s->done && !s->failed)
        if (cv.wait_until(lk, deadline) == std::cv_status::timeout && !s->done) fail_split_locked(*s);
    if (s->failed) {
        t_last = s->msg;
        return ncclSystemError;
    }
    if (child && child->state != ncclSuccess) {
        t_last = child->msg;
        return child->state;
    }
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!asyncError) return api_fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    std::lock_guard<std::mutex> g(mu);
    if (!comm || !live.count(comm))
        return api_fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm %p is not a live communicator", (void *)comm);
    refresh_locked(comm); /* never waits */
    *asyncError = comm->state;
    return ncclSuccess;
}

static ncclResult_t query(const ncclComm *comm, const char *fn, const void *out, int *dst, int which)
{
    if (!out) return api_fail(ncclInvalidArgument, "%s: output pointer is NULL", fn);
    std::shared_ptr<ncclComm> c;
    std::lock_guard<std::mutex> g(mu);
    ncclResult_t r = usable_locked(const_cast<ncclComm *>(comm), fn, &c);
    if (r != ncclSuccess) return r;
    *dst = which == 0 ? c->nranks : which == 1 ? c->rank : c->device;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) { return query(comm, "ncclCommCount", count, count, 0); }
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) { return query(comm, "ncclCommUserRank", rank, rank, 1); }
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    return query(comm, "ncclCommCuDevice", device, device, 2);
}

/* nccl.h ncclCommFinalize: "flushes all issued communications, and marks communicator state as
 * ncclInProgress. The state will change to ncclSuccess when the communicator is globally quiescent" */
ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    std::shared_ptr<ncclComm> c;
    std::unique_lock<std::mutex> lk(mu);
    ncclResult_t r = usable_locked(comm, "ncclCommFinalize", &c);
    if (r != ncclSuccess) return r;
    c->finalized = true;
    c->state = ncclInProgress;
    c->pending = P_FINALIZE;
    refresh_locked(c.get());
    if (!c->blocking) return c->state == ncclSuccess ? ncclSuccess : ncclInProgress;
    auto deadline = Clock::now() + std::chrono::milliseconds(devsim::deadlock_ms());
    while (c->state == ncclInProgress) {
        if (cv.wait_until(lk, deadline) == std::cv_status::timeout) {
            refresh_locked(c.get());
            if (c->state != ncclInProgress) break;
            set_async_locked(c.get(), ncclSystemError,
                             format("deadlock: ncclCommFinalize of rank %d on comm %s: %lld operation(s) still queued after "
                                    "MOE_DEVSIM_DEADLOCK_MS = %d ms", c->rank, c->clique->name.c_str(),
                                    (long long)c->in_flight, devsim::deadlock_ms()));
            t_last = c->msg;
            return ncclSystemError;
        }
        refresh_locked(c.get());
    }
    return c->state;
}

/* Marks the rank gone for its peers and forgets the handle (lock held). */
static void retire_locked(ncclComm *c)
{
    if (c->clique && c->rank >= 0 && (size_t)c->rank < c->clique->members.size() && c->clique->members[(size_t)c->rank] == c) {
        c->clique->members[(size_t)c->rank] = nullptr;
        c->clique->gone[(size_t)c->rank] = 1;
    }
    live.erase(c);
    cv.notify_all();
}

/* nccl.h ncclCommDestroy: "Frees local resources associated with communicator object"; without a
 * finalize first it flushes the comm's operations (waits for them). */
ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    std::unique_lock<std::mutex> lk(mu);
    auto it = live.find(comm);
    if (it == live.end())
        return api_fail(ncclInvalidUsage, "ncclCommDestroy: comm %p is not a live communicator", (void *)comm);
    std::shared_ptr<ncclComm> c = it->second;
    auto deadline = Clock::now() + std::chrono::milliseconds(devsim::deadlock_ms());
    ncclResult_t r = ncclSuccess;
    while (c->in_flight > 0) {
        if (cv.wait_until(lk, deadline) == std::cv_status::timeout && c->in_flight > 0) {
            r = api_fail(ncclSystemError, "ncclCommDestroy: rank %d still has %lld operation(s) queued after "
                         "MOE_DEVSIM_DEADLOCK_MS = %d ms; aborted them", c->rank, (long long)c->in_flight,
                         devsim::deadlock_ms());
            c->aborted = true;
            break;
        }
    }
    retire_locked(c.get());
    return r;
}

/* nccl.h ncclCommAbort: "Frees resources associated with communicator object and aborts any
 * operations that might still be running on the device." Waiting operations of this rank stop at
 * once; peers waiting for it get ncclRemoteError. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    std::lock_guard<std::mutex> g(mu);
    auto it = live.find(comm);
    if (it == live.end())
        return api_fail(ncclInvalidUsage, "ncclCommAbort: comm %p is not a live communicator", (void *)comm);
    std::shared_ptr<ncclComm> c = it->second;
    c->aborted = true;
    if (c->split_wait && !c->split_wait->done) {
        /* a split this rank waits for can no longer complete for it; peers time out or finish */
        c->split_wait.reset();
    }
    retire_locked(c.get());
    return ncclSuccess;
}

/* ---------------------------------------------------------------- groups */
/* UG API "Group Calls": group primitives define the behaviour of the current thread; calls are
 * collected until the outermost ncclGroupEnd, which launches them. */
ncclResult_t ncclGroupStart()
{
    t_group.depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd()
{
    if (t_group.depth == 0) return api_fail(ncclInvalidUsage, "ncclGroupEnd: not inside ncclGroupStart");
    if (--t_group.depth > 0) return ncclSuccess;
    Group g;
    std::swap(g, t_group);
    if (g.first != ncclSuccess) {
        /* nccl.h ncclGroupEnd: the group is one fused operation; a failed call fails all of it */
        t_last = g.first_msg;
        return g.first;
    }
    ncclResult_t r = ncclSuccess;
    if (!g.items.empty()) r = launch(g.items);
    if (r != ncclSuccess) return r;
    /* nccl.h ncclGroupEnd with ncclCommInitRank: "waits for all communicators to be initialized" */
    {
        std::unique_lock<std::mutex> lk(mu);
        for (auto &c : g.waits) {
            wait_ready_locked(lk, c.get());
            if (c->state != ncclSuccess && r == ncclSuccess) {
                r = c->state;
                t_last = c->msg;
            }
        }
    }
    if (r != ncclSuccess) return r;
    /* UG "Nonblocking Group Operation": with non-blocking comms ncclGroupEnd may return
     * ncclInProgress; the comms' states say when the launch is done (here: already). */
    return g.nonblocking ? ncclInProgress : ncclSuccess;
}

/* ---------------------------------------------------------------- operations */
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream)
{
    return issue({K_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, 0}, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    return issue({K_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, 0}, comm, stream);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream)
{
    return issue({K_REDUCE, sendbuff, recvbuff, count, datatype, op, root, 0}, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    return issue({K_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, 0}, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return issue({K_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, 0}, comm, stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return issue({K_SEND, sendbuff, nullptr, count, datatype, ncclSum, 0, peer}, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return issue({K_RECV, nullptr, recvbuff, count, datatype, ncclSum, 0, peer}, comm, stream);
}

/* nccl.h ncclMemAlloc / ncclMemFree: device memory for NCCL buffers (plain device memory here). */
ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr) return api_fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    cudaError_t e = cudaMalloc(ptr, size);
    return e == cudaSuccess ? ncclSuccess
                            : api_fail(ncclUnhandledCudaError, "ncclMemAlloc: cudaMalloc failed: %s", cudaGetErrorString(e));
}

ncclResult_t ncclMemFree(void *ptr)
{
    cudaError_t e = cudaFree(ptr);
    return e == cudaSuccess ? ncclSuccess
                            : api_fail(ncclUnhandledCudaError, "ncclMemFree: cudaFree failed: %s", cudaGetErrorString(e));
}

} /* extern "C" */

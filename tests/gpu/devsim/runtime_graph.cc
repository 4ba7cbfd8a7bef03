/*
 * Stream capture and CUDA Graphs in the runtime stand-in: work queued on a capturing stream is
 * recorded (devsim::enqueue), not run; an instantiated graph replays the recorded operations, in
 * order, on the stream it is launched into.
 *
 * Rules (CUDA Runtime API, "Graph Management" and "Stream Management"; CUDA C++ Programming Guide,
 * "CUDA Graphs: Prohibited and Unhandled Operations"):
 *  - the legacy stream cannot be captured; a stream already capturing cannot begin again;
 *  - a capture begun in cudaStreamCaptureModeGlobal or ThreadLocal must be ended by the thread that
 *    began it (cudaErrorStreamCaptureWrongThread);
 *  - an invalidated capture (an illegal operation during it) ends with
 *    cudaErrorStreamCaptureInvalidated and no graph;
 *  - "each launch is ordered behind both any previous work in stream and any previous launches of
 *    graphExec" (cudaGraphLaunch).
 * Not modelled: captures that fork into other streams through events (refused with
 * cudaErrorStreamCaptureIsolation in cudaStreamWaitEvent), graph memory nodes (cudaMallocAsync while
 * capturing is refused), graph updates.
 */
#include "runtime_state.h"

using namespace devsim;

/* The graph objects: cudaGraph_t and cudaGraphExec_t point to these. */
struct CUgraph_st {
    Graph g;
};
struct CUgraphExec_st {
    GraphExec x;
};

extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t h, enum cudaStreamCaptureMode mode)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    if (h == nullptr || h == cudaStreamLegacy)
        return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: the legacy stream cannot be captured");
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: mode %d", (int)mode);
    if (s->capture_mode >= 0)
        return fail(cudaErrorIllegalState, "cudaStreamBeginCapture: stream %p is already capturing", (void *)h);
    if (cudaError_t e = st.dev[(size_t)s->device].sticky) return fail(e, "cudaStreamBeginCapture: device faulted");
    if (fault("graph")) return fail(cudaErrorUnknown, "cudaStreamBeginCapture: injected fault");
    s->capture = new Graph;
    s->capture_mode = (int)mode;
    s->capture_invalid = false;
    s->capture_thread = std::this_thread::get_id();
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t *out)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    if (!out) return fail(cudaErrorInvalidValue, "cudaStreamEndCapture: pGraph is NULL");
    *out = nullptr;
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    if (s->capture_mode < 0)
        return fail(cudaErrorIllegalState, "cudaStreamEndCapture: stream %p is not capturing", (void *)h);
    if (s->capture_mode != cudaStreamCaptureModeRelaxed && s->capture_thread != std::this_thread::get_id())
        return fail(cudaErrorStreamCaptureWrongThread, "cudaStreamEndCapture: the capture of stream %p was begun by "
                    "another thread", (void *)h);
    Graph *gr = s->capture;
    const bool invalid = s->capture_invalid;
    s->capture = nullptr;
    s->capture_mode = -1;
    s->capture_invalid = false;
    if (invalid) {
        delete gr;
        return fail(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture: the capture was invalidated by an "
                    "operation that is illegal during capture");
    }
    CUgraph_st *cg = new CUgraph_st;
    cg->g = std::move(*gr);
    delete gr;
    *out = cg;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t h, enum cudaStreamCaptureStatus *status)
{
    State &st = state();
    std::lock_guard<std::mutex> g(st.mu);
    if (!status) return fail(cudaErrorInvalidValue, "cudaStreamIsCapturing: pCaptureStatus is NULL");
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    if (s->legacy) {
        /* "cudaErrorStreamCaptureImplicit if the legacy stream is queried while a blocking stream of
         * the same device is capturing" (cudaStreamIsCapturing) */
        for (Stream *t : st.streams)
            if (t->capture_mode >= 0 && t->device == s->device && !(t->flags & cudaStreamNonBlocking)) {
                t->capture_invalid = true;
                return fail(cudaErrorStreamCaptureImplicit, "cudaStreamIsCapturing on the legacy stream while a "
                            "blocking stream captures");
            }
    }
    *status = s->capture_mode < 0 ? cudaStreamCaptureStatusNone
              : s->capture_invalid ? cudaStreamCaptureStatusInvalidated
                                   : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *out, cudaGraph_t graph, unsigned long long flags)
{
    if (!out || !graph) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: NULL argument");
    if (flags) return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: flags 0x%llx are not simulated", flags);
    if (fault("graph")) return fail(cudaErrorUnknown, "cudaGraphInstantiate: injected fault");
    std::lock_guard<std::mutex> g(state().mu);
    CUgraphExec_st *x = new CUgraphExec_st;
    x->x.ops = graph->g.ops; /* copies: the graph may be destroyed at once */
    *out = x;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t h)
{
    State &st = state();
    if (!exec) return fail(cudaErrorInvalidValue, "cudaGraphLaunch: graphExec is NULL");
    if (cudaError_t e = sticky_current()) return e;
    if (fault("graph")) return fail(cudaErrorUnknown, "cudaGraphLaunch: injected fault");
    std::lock_guard<std::mutex> g(st.mu);
    Stream *s = nullptr;
    if (cudaError_t e = resolve_locked(h, &s)) return e;
    if (s->capture_mode >= 0) {
        s->capture_invalid = true;
        return fail(cudaErrorStreamCaptureUnsupported, "cudaGraphLaunch into a capturing stream is not simulated");
    }
    if (s->device != thread_device())
        return fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: stream of device %d, device %d current",
                    s->device, thread_device());
    GraphExec &x = exec->x;
    bool first = true;
    for (const GraphOp &gop : x.ops) {
        Op op;
        op.what = gop.what;
        op.run = gop.run;
        if (first && x.last.s) op.deps.push_back(x.last); /* behind the previous launch */
        first = false;
        push_locked(s, std::move(op));
    }
    if (x.ops.empty()) {
        Op op;
        op.what = "cudaGraphLaunch (empty)";
        if (x.last.s) op.deps.push_back(x.last);
        push_locked(s, std::move(op));
    }
    x.last = {s, s->issued};
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    if (!graph) return fail(cudaErrorInvalidValue, "cudaGraphDestroy: NULL");
    std::lock_guard<std::mutex> g(state().mu);
    delete graph;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    if (!exec) return fail(cudaErrorInvalidValue, "cudaGraphExecDestroy: NULL");
    std::lock_guard<std::mutex> g(state().mu);
    delete exec; /* queued replays hold copies of their operations */
    return cudaSuccess;
}

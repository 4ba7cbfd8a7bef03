/* Context lifetime, configuration and memory statistics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/host_alloc.h"
#include "api/config_header.h"
#include "runtime/runtime.h"
#include "core/layer.h"

MOE_API int32_t moe_context_config_init(moe_context_config *cfg, size_t struct_size)
{
    return moe_config_init(&moe_desc_context_config, cfg, struct_size);
}

/* Copies a hook table whose first member is struct_size; returns 0 if the size is too small. */
static int copy_hook(void *dst, size_t ours, const void *src)
{
    uint32_t sz;
    memcpy(&sz, src, sizeof sz);
    if (sz < ours) return 0;
    memcpy(dst, src, ours);
    return 1;
}

MOE_API int32_t moe_context_create(const moe_context_config *cfg_in, moe_context **out)
{
    if (!out) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_context_create: out is NULL");
    moe_context_config cfg;
    moe_context_config dflt;
    if (!cfg_in) {
        moe_context_config_init(&dflt, sizeof dflt);
        cfg_in = &dflt;
    }
    int32_t st = moe_config_copy(NULL, &moe_desc_context_config, cfg_in, &cfg);
    if (st) return st;
    if (cfg.device_type == 0) cfg.device_type = MOE_DEVICE_CPU;
    if (cfg.device_type != MOE_DEVICE_CPU && cfg.device_type != MOE_DEVICE_CUDA)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_context_config.device_type = %d; expected MOE_DEVICE_CPU (1) "
                          "or MOE_DEVICE_CUDA (2)", cfg.device_type);
    const moe_backend *be = moe_backend_for_device(cfg.device_type);
    if (!be)
        return moe_errorf(NULL, MOE_ERR_UNSUPPORTED, "moe_context_config.device_type = MOE_DEVICE_CUDA: this build has no "
                          "CUDA backend (moe_build_features() lacks MOE_FEATURE_CUDA)");
    int32_t ndev = 0;
    if (be->device_count(&ndev) == MOE_OK && ndev == 0)
        return moe_errorf(NULL, MOE_ERR_UNSUPPORTED, "moe_context_config.device_type = MOE_DEVICE_CUDA: this build has a "
                          "CUDA backend but no CUDA device is visible here (no driver, or CUDA_VISIBLE_DEVICES hides them)");
    if (cfg.device_id < 0 || cfg.device_id >= ndev)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_context_config.device_id = %d; the %s backend has %d "
                          "device(s) here, ids 0 .. %d", cfg.device_id, be->name, ndev, ndev - 1);
    if (cfg.num_threads < 0 || cfg.num_threads > 4096)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_context_config.num_threads = %d; expected 0 (all cores) .. 4096",
                          cfg.num_threads);
    moe_context tmp;
    memset(&tmp, 0, sizeof tmp);
    if (cfg.allocator) {
        if (!copy_hook(&tmp.allocator, sizeof tmp.allocator, cfg.allocator))
            return moe_errorf(NULL, MOE_ERR_VERSION, "moe_context_config.allocator->struct_size is smaller than %zu",
                              sizeof tmp.allocator);
        if ((tmp.allocator.alloc == NULL) != (tmp.allocator.free == NULL))
            return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_context_config.allocator: set both alloc and free, or neither");
        tmp.has_allocator = 1;
    }
    if (cfg.logger) {
        if (!copy_hook(&tmp.err.logger, sizeof tmp.err.logger, cfg.logger))
            return moe_errorf(NULL, MOE_ERR_VERSION, "moe_context_config.logger->struct_size is smaller than %zu",
                              sizeof tmp.err.logger);
        tmp.err.has_logger = 1;
    }
    if (cfg.profiler) {
        if (!copy_hook(&tmp.profiler, sizeof tmp.profiler, cfg.profiler))
            return moe_errorf(NULL, MOE_ERR_VERSION, "moe_context_config.profiler->struct_size is smaller than %zu",
                              sizeof tmp.profiler);
        tmp.has_profiler = 1;
    }
    void *dev = NULL;
    st = be->device_open(cfg.device_id, &dev);
    if (st) return moe_errorf(NULL, st, "moe_context_create: opening %s device %d failed", be->name, cfg.device_id);
    moe_context *ctx = moe_host_malloc(sizeof *ctx); /* the context itself precedes its allocator */
    if (!ctx) {
        be->device_close(dev);
        return moe_errorf(NULL, MOE_ERR_OUT_OF_MEMORY, "moe_context_create: out of memory");
    }
    *ctx = tmp;
    ctx->backend = be;
    ctx->device_state = dev;
    ctx->stream = be->default_stream(dev);
    atomic_init(&ctx->refs, 1);
    ctx->device_type = cfg.device_type;
    ctx->device_id = cfg.device_id;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    ctx->num_threads = cfg.num_threads > 0 ? cfg.num_threads : (cores > 0 ? (int32_t)cores : 1);
    if (be->workspace_bytes > 0) {
        ctx->workspace = moe_mem_alloc(ctx, be->workspace_bytes, MOE_MEM_WORKSPACE);
        if (!ctx->workspace) {
            /* why (out of memory, or a hook that broke its contract) is on ctx: pass it on */
            char why[MOE_ERROR_CAP];
            snprintf(why, sizeof why, "%s", ctx->err.last_error);
            const int32_t st_ws = strstr(why, "moe_allocator.alloc returned") ? MOE_ERR_CALLBACK : MOE_ERR_OUT_OF_MEMORY;
            /* a failed create retains nothing: the host still owns its hooks' user_data */
            ctx->has_allocator = ctx->err.has_logger = ctx->has_profiler = 0;
            moe_context_release_ref(ctx);
            return moe_errorf(NULL, st_ws, "moe_context_create: the %zu-byte %s workspace: %s", be->workspace_bytes,
                              be->name, why);
        }
        if (be->caps & MOE_BACKEND_CAP_ASYNC) { /* the context's stream's slot (runtime/entry.h) */
            ctx->ws[0] = (moe_ws_slot){ctx->stream, ctx->workspace, NULL, 0};
            ctx->ws_count = 1;
        }
    }
    *out = ctx;
    return MOE_OK;
}

MOE_API void moe_context_destroy(moe_context *ctx)
{
    if (ctx) moe_context_release_ref(ctx);
}

MOE_API int32_t moe_context_num_threads(const moe_context *ctx, int32_t *out)
{
    if (!ctx) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_context_num_threads: ctx is NULL");
    if (!out) return moe_errorf((moe_context *)ctx, MOE_ERR_INVALID_ARGUMENT, "moe_context_num_threads: out is NULL");
    *out = ctx->num_threads;
    return MOE_OK;
}

MOE_API int32_t moe_memory_stats_init(moe_memory_stats *stats, size_t struct_size)
{
    return moe_output_init(&moe_desc_memory_stats, stats, struct_size, "stats");
}

MOE_API int32_t moe_context_memory_trim(moe_context *ctx, void *stream)
{
    if (!ctx) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_context_memory_trim: ctx is NULL");
    MOE_ENTER(en, ex, ctx, stream, NULL);
    (void)ex;
    moe_mem_trim(ctx);
    return MOE_OK;
}

MOE_API int32_t moe_step_memory_stats(const moe_step *step, moe_memory_stats *stats)
{
    if (!step) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_step_memory_stats: step is NULL");
    moe_context *c = step->layer->ctx;
    if (!stats) return moe_errorf(c, MOE_ERR_INVALID_ARGUMENT, "moe_step_memory_stats: stats is NULL");
    size_t n = 0;
    int32_t st = moe_output_size(c, &moe_desc_memory_stats, "moe_step_memory_stats", "stats", stats, &n);
    if (st) return st;
    moe_memory_stats s;
    memset(&s, 0, sizeof s);
    for (int i = 0; i < MOE_MEM_NUM_CATEGORIES; i++) {
        s.current_bytes[i] = step->mem_cur[i];
        s.peak_bytes[i] = step->mem_peak[i];
        s.total_current_bytes += step->mem_cur[i];
    }
    s.total_peak_bytes = step->mem_total_peak;
    s.num_allocations = step->mem_live;
    moe_output_write(stats, &s, n);
    return MOE_OK;
}

MOE_API int32_t moe_context_memory_stats(const moe_context *ctx, moe_memory_stats *stats)
{
    if (!ctx) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_context_memory_stats: ctx is NULL");
    moe_context *c = (moe_context *)ctx;
    if (!stats) return moe_errorf(c, MOE_ERR_INVALID_ARGUMENT, "moe_context_memory_stats: stats is NULL");
    size_t n = 0;
    int32_t st = moe_output_size(c, &moe_desc_memory_stats, "moe_context_memory_stats", "stats", stats, &n);
    if (st) return st;
    moe_memory_stats s;
    memset(&s, 0, sizeof s);
    memcpy(s.current_bytes, ctx->mem_current, sizeof s.current_bytes);
    memcpy(s.peak_bytes, ctx->mem_peak, sizeof s.peak_bytes);
    s.total_current_bytes = ctx->mem_total_current;
    s.total_peak_bytes = ctx->mem_total_peak;
    s.num_allocations = ctx->mem_live;
    s.cached_bytes = (int64_t)ctx->pool_bytes;
    s.reserved_bytes = ctx->mem_total_current + (int64_t)ctx->pool_bytes;
    s.peak_reserved_bytes = ctx->pool_peak_reserved > s.reserved_bytes ? ctx->pool_peak_reserved : s.reserved_bytes;
    s.device_allocations = ctx->dev_allocs;
    s.trims = ctx->trims;
    moe_output_write(stats, &s, n);
    return MOE_OK;
}

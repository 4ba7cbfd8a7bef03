/*
 * Communicators: the exported moe_comm_* functions (argument checks, config header, status and
 * message). The implementations live in src/comm/. moe_comm_split_layout lives with the layouts
 * (src/parallel/).
 */
#include <string.h>

#include "api/config_header.h"
#include "comm/comm_impl.h"

MOE_API int32_t moe_comm_config_init(moe_comm_config *cfg, size_t struct_size)
{
    return moe_config_init(&moe_desc_comm_config, cfg, struct_size);
}

/* Copies and checks cfg (NULL = defaults); *timeout_ms receives the resolved timeout. */
static int32_t resolve_config(moe_context *ctx, const char *fn, const moe_comm_config *cfg_in, int32_t *timeout_ms)
{
    moe_comm_config cfg;
    if (cfg_in) {
        int32_t st = moe_config_copy(ctx, &moe_desc_comm_config, cfg_in, &cfg);
        if (st) return st;
    } else {
        moe_comm_config_init(&cfg, sizeof cfg);
    }
    if (cfg.timeout_ms < 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: moe_comm_config.timeout_ms = %d; expected >= 0 (0 = %d ms)", fn,
                          cfg.timeout_ms, MOE_COMM_DEFAULT_TIMEOUT_MS);
    if (cfg.reserved0 != 0)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: moe_comm_config.reserved0 = %d; expected 0", fn, cfg.reserved0);
    *timeout_ms = cfg.timeout_ms > 0 ? cfg.timeout_ms : MOE_COMM_DEFAULT_TIMEOUT_MS;
    return MOE_OK;
}

/* The checks every create function starts with. */
static int32_t create_prologue(moe_context *ctx, const char *fn, const moe_comm_config *cfg, moe_comm **out,
                               int32_t *timeout_ms)
{
    if (!ctx) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
    if (!out) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    return resolve_config(ctx, fn, cfg, timeout_ms);
}

MOE_API int32_t moe_comm_create_self(moe_context *ctx, const moe_comm_config *cfg, moe_comm **out)
{
    int32_t timeout_ms = 0;
    int32_t st = create_prologue(ctx, "moe_comm_create_self", cfg, out, &timeout_ms);
    if (st) return st;
    return moe_comm_self_create(ctx, timeout_ms, out);
}

MOE_API int32_t moe_comm_create_mpi(moe_context *ctx, const moe_comm_config *cfg, const void *mpi_comm, moe_comm **out)
{
    const char *fn = "moe_comm_create_mpi";
    int32_t timeout_ms = 0;
    int32_t st = create_prologue(ctx, fn, cfg, out, &timeout_ms);
    if (st) return st;
#ifdef MOE_HAVE_MPI
    return moe_comm_mpi_create(ctx, timeout_ms, mpi_comm, out);
#else
    (void)mpi_comm;
    return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "%s: this build has no MPI support (moe_build_features() lacks "
                      "MOE_FEATURE_MPI); rebuild with an MPI implementation (Debian: libopenmpi-dev) and MOE_MPI=AUTO or ON",
                      fn);
#endif
}

MOE_API int32_t moe_comm_nccl_unique_id(void *buf, size_t cap, size_t *len)
{
    const char *fn = "moe_comm_nccl_unique_id";
    if (!buf) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: buf is NULL", fn);
    if (!len) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: len is NULL", fn);
    if (cap < 128)
        return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: cap = %zu; the NCCL unique id needs 128 bytes", fn, cap);
#ifdef MOE_HAVE_NCCL
    return moe_comm_nccl_get_unique_id(buf, cap, len);
#else
    return moe_errorf(NULL, MOE_ERR_UNSUPPORTED, "%s: this build has no NCCL support (moe_build_features() lacks "
                      "MOE_FEATURE_NCCL); rebuild with the CUDA toolkit's NCCL and MOE_NCCL=AUTO or ON", fn);
#endif
}

MOE_API int32_t moe_comm_create_nccl(moe_context *ctx, const moe_comm_config *cfg, const void *unique_id, size_t id_len,
                                     int32_t rank, int32_t size, moe_comm **out)
{
    const char *fn = "moe_comm_create_nccl";
    int32_t timeout_ms = 0;
    int32_t st = create_prologue(ctx, fn, cfg, out, &timeout_ms);
    if (st) return st;
    if (!unique_id)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: unique_id is NULL; expected the bytes of "
                          "moe_comm_nccl_unique_id from rank 0", fn);
    if (id_len != 128)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: id_len = %zu; expected 128 (the length "
                          "moe_comm_nccl_unique_id reported)", fn, id_len);
    if (size < 1) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: size = %d; expected >= 1", fn, size);
    if (rank < 0 || rank >= size)
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: rank = %d; expected 0 .. %d (size - 1)", fn, rank, size - 1);
#ifdef MOE_HAVE_NCCL
    return moe_comm_nccl_create(ctx, timeout_ms, unique_id, rank, size, out);
#else
    return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "%s: this build has no NCCL support (moe_build_features() lacks "
                      "MOE_FEATURE_NCCL); rebuild with the CUDA toolkit's NCCL and MOE_NCCL=AUTO or ON", fn);
#endif
}

MOE_API int32_t moe_comm_create_hooks(moe_context *ctx, const moe_comm_config *cfg, const moe_comm_hooks *hooks,
                                      moe_comm **out)
{
    const char *fn = "moe_comm_create_hooks";
    int32_t timeout_ms = 0;
    int32_t st = create_prologue(ctx, fn, cfg, out, &timeout_ms);
    if (st) return st;
    if (!hooks) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: hooks is NULL", fn);
    return moe_comm_hooks_create(ctx, timeout_ms, hooks, out);
}

MOE_API int32_t moe_comm_create_modeled(moe_comm *inner, double latency_us, double bandwidth_gb_per_s, moe_comm **out)
{
    const char *fn = "moe_comm_create_modeled";
    if (!inner) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: inner is NULL", fn);
    moe_context *ctx = inner->ctx;
    if (!out) return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (!(latency_us >= 0 && latency_us <= 1e9))
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: latency_us = %g; expected a finite value in 0 .. 1e9", fn,
                          latency_us);
    if (!(bandwidth_gb_per_s > 0 && bandwidth_gb_per_s <= 1e6))
        return moe_errorf(ctx, MOE_ERR_INVALID_ARGUMENT, "%s: bandwidth_gb_per_s = %g; expected a finite value in "
                          "(0, 1e6]", fn, bandwidth_gb_per_s);
    if (moe_comm_wants_device_buffers(inner))
        return moe_errorf(ctx, MOE_ERR_UNSUPPORTED, "%s: inner is a %s comm; the model wraps host comms (self, MPI, "
                          "hooks, modeled), whose exchanges complete on the host", fn, moe_comm_kind_name(inner->kind));
    return moe_comm_modeled_create(inner, latency_us, bandwidth_gb_per_s, out);
}

MOE_API int32_t moe_comm_split(moe_comm *comm, int32_t color, int32_t key, moe_comm **out)
{
    const char *fn = "moe_comm_split";
    if (!comm) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "%s: comm is NULL", fn);
    if (!out) return moe_errorf(comm->ctx, MOE_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    moe_comm *res = NULL;
    int32_t st = comm->ops->split(comm, color, key, &res);
    if (st) return st;
    *out = res;
    return MOE_OK;
}

MOE_API int32_t moe_comm_rank(const moe_comm *comm, int32_t *out)
{
    if (!comm) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_comm_rank: comm is NULL");
    if (!out) return moe_errorf(comm->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm_rank: out is NULL");
    *out = comm->rank;
    return MOE_OK;
}

MOE_API int32_t moe_comm_size(const moe_comm *comm, int32_t *out)
{
    if (!comm) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_comm_size: comm is NULL");
    if (!out) return moe_errorf(comm->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm_size: out is NULL");
    *out = comm->size;
    return MOE_OK;
}

MOE_API int32_t moe_comm_kind(const moe_comm *comm, int32_t *out)
{
    if (!comm) return moe_errorf(NULL, MOE_ERR_INVALID_ARGUMENT, "moe_comm_kind: comm is NULL");
    if (!out) return moe_errorf(comm->ctx, MOE_ERR_INVALID_ARGUMENT, "moe_comm_kind: out is NULL");
    *out = comm->kind;
    return MOE_OK;
}

MOE_API void moe_comm_destroy(moe_comm *comm)
{
    if (comm) moe_comm_release_ref(comm);
}

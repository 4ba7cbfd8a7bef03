/* Status names, error messages (per context, thread-local fallback) and logging: the bottom module
 * (base/error.h) every layer calls, and the exported status and last-error functions. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

/* The sink a context begins with (base/error.h); NULL for none. */
static moe_error_sink *sink_of(const moe_context *ctx) { return (moe_error_sink *)(void *)ctx; }

static _Thread_local char tls_error[MOE_ERROR_CAP];
static _Thread_local moe_error_sink *tls_redirect;

moe_error_sink *moe_error_redirect(moe_error_sink *sink)
{
    moe_error_sink *old = tls_redirect;
    tls_redirect = sink;
    return old;
}

MOE_API const char *moe_status_name(int32_t status)
{
    switch (status) {
    case MOE_OK: return "MOE_OK";
    case MOE_ERR_INVALID_ARGUMENT: return "MOE_ERR_INVALID_ARGUMENT";
    case MOE_ERR_UNSUPPORTED: return "MOE_ERR_UNSUPPORTED";
    case MOE_ERR_OUT_OF_MEMORY: return "MOE_ERR_OUT_OF_MEMORY";
    case MOE_ERR_VERSION: return "MOE_ERR_VERSION";
    case MOE_ERR_STATE: return "MOE_ERR_STATE";
    case MOE_ERR_NONFINITE: return "MOE_ERR_NONFINITE";
    case MOE_ERR_BACKEND: return "MOE_ERR_BACKEND";
    case MOE_ERR_COMM: return "MOE_ERR_COMM";
    case MOE_ERR_TIMEOUT: return "MOE_ERR_TIMEOUT";
    case MOE_ERR_CALLBACK: return "MOE_ERR_CALLBACK";
    case MOE_ERR_INTERNAL: return "MOE_ERR_INTERNAL";
    case MOE_ERR_IO: return "MOE_ERR_IO";
    default: return "MOE_ERR_UNKNOWN";
    }
}

MOE_API const char *moe_status_string(int32_t status)
{
    switch (status) {
    case MOE_OK: return "success";
    case MOE_ERR_INVALID_ARGUMENT: return "invalid argument";
    case MOE_ERR_UNSUPPORTED: return "unsupported by this build or backend";
    case MOE_ERR_OUT_OF_MEMORY: return "out of memory";
    case MOE_ERR_VERSION: return "struct size or API version not understood";
    case MOE_ERR_STATE: return "call out of order for this object's state";
    case MOE_ERR_NONFINITE: return "NaN or Inf in an input";
    case MOE_ERR_BACKEND: return "backend (BLAS / CUDA) failure";
    case MOE_ERR_COMM: return "communication failure";
    case MOE_ERR_TIMEOUT: return "timed out";
    case MOE_ERR_CALLBACK: return "a host callback failed";
    case MOE_ERR_INTERNAL: return "internal error";
    case MOE_ERR_IO: return "a file could not be read or written, or is damaged";
    default: return "unknown status";
    }
}

const char *moe_error_last(const moe_context *ctx)
{
    if (ctx && tls_redirect) return tls_redirect->last_error;
    return ctx ? sink_of(ctx)->last_error : tls_error;
}

static size_t copy_out(const char *msg, char *buf, size_t cap)
{
    size_t n = strlen(msg);
    if (buf && cap > 0) {
        size_t c = n < cap - 1 ? n : cap - 1;
        memcpy(buf, msg, c);
        buf[c] = '\0';
    }
    return n;
}

MOE_API size_t moe_context_last_error(const moe_context *ctx, char *buf, size_t cap)
{
    return copy_out(ctx ? sink_of(ctx)->last_error : tls_error, buf, cap);
}

MOE_API size_t moe_last_error(char *buf, size_t cap) { return copy_out(tls_error, buf, cap); }

static void deliver(moe_error_sink *s, int32_t level, const char *msg)
{
    if (s && s->has_logger && s->logger.log && level <= s->logger.max_level) s->logger.log(s->logger.user_data, level, msg);
}

int32_t moe_errorf(moe_context *ctx, int32_t status, const char *fmt, ...)
{
    moe_error_sink *s = ctx && tls_redirect ? tls_redirect : sink_of(ctx);
    char *dst = s ? s->last_error : tls_error;
    /* formatted into a local buffer first: the arguments may include the previous message */
    char msg[MOE_ERROR_CAP];
    int n = snprintf(msg, sizeof msg, "%s: ", moe_status_name(status));
    if (n < 0 || n >= MOE_ERROR_CAP) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    memcpy(dst, msg, sizeof msg);
    if (s) memcpy(tls_error, s->last_error, MOE_ERROR_CAP); /* the fallback always has the latest */
    deliver(s, MOE_LOG_ERROR, dst);
    return status;
}

void moe_logf(moe_context *ctx, int32_t level, const char *fmt, ...)
{
    moe_error_sink *s = ctx && tls_redirect ? tls_redirect : sink_of(ctx);
    if (!s || !s->has_logger || !s->logger.log || level > s->logger.max_level) return;
    char msg[MOE_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->logger.log(s->logger.user_data, level, msg);
}

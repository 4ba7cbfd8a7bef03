/*
 * Errors and logging: the bottom module every floor of the engine may call (the backends, the
 * runtime, comms, the core, the API). Messages are kept on the context, or in a thread-local
 * fallback when there is none, and go to the host's logger; nothing is printed.
 *
 * base/ knows no context: a context begins with its moe_error_sink (runtime/context.h asserts it),
 * and a pointer to a struct, suitably converted, points to its first member (C11 6.7.2.1p15), so
 * these functions take the context pointer every caller has and reach only the sink through it.
 */
#ifndef MOE_BASE_ERROR_H
#define MOE_BASE_ERROR_H

#include <stdint.h>

#include "moe.h"

#define MOE_ERROR_CAP 1024

/* Where a context keeps its errors: the last message and the host's logger (has_logger: set). */
typedef struct moe_error_sink {
    char last_error[MOE_ERROR_CAP];
    moe_logger logger;
    int32_t has_logger;
} moe_error_sink;

/* Records a message (printf-style) on ctx, or in the thread-local fallback when ctx is NULL, sends
 * it to the logger at ERROR level, and returns status. */
int32_t moe_errorf(moe_context *ctx, int32_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void moe_logf(moe_context *ctx, int32_t level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Sends the calling thread's messages for any context to `sink` instead (NULL: back to the context's
 * own); returns the previous redirect. The two halves of a merged step (runtime/lanes.h) keep their
 * errors apart this way and the entry point reports the first. */
moe_error_sink *moe_error_redirect(moe_error_sink *sink);
/* The last message recorded for ctx on this thread (its redirect's, if any). */
const char *moe_error_last(const moe_context *ctx);

/* Early return on a non-OK status. */
#define TRY(expr)                                                                                                    \
    do {                                                                                                             \
        int32_t st_ = (expr);                                                                                        \
        if (st_ != MOE_OK) return st_;                                                                               \
    } while (0)

#endif /* MOE_BASE_ERROR_H */

/*
 * Errors and logging: the bottom module every layer of the engine may call (src/api, src/core,
 * src/comm, src/mem, src/parallel, src/backend). Messages are kept on the context, or in a
 * thread-local fallback when there is none, and go to the host's logger; nothing is printed.
 */
#ifndef MOE_BASE_ERROR_H
#define MOE_BASE_ERROR_H

#include <stdint.h>

#include "moe.h"

#define MOE_ERROR_CAP 1024

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

#endif /* MOE_BASE_ERROR_H */

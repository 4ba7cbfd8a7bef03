/* A CPU backend whose device memory faults when the host touches it outside ops and backend
 * entries (guarded_backend.c), for the tests of the host/device contract. */
#ifndef MOE_TEST_GUARDED_BACKEND_H
#define MOE_TEST_GUARDED_BACKEND_H

#include "moe.h"
#include "backend/backend.h"

/* The backend (copy it somewhere that outlives the contexts using it). */
moe_backend guarded_backend(void);
/* Device blocks mapped now. */
int guarded_blocks(void);

#endif

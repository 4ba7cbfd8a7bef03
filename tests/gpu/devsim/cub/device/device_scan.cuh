/* The device simulator's CUB stand-in (../devsim_cub.h). */
#include "../devsim_cub.h"

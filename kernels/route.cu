/* Kernels of the route ops (to be written). */
#include "kcommon.cuh"

namespace MOE_KNS {

void fill_route(moe_ops *t) { (void)t; }

} // namespace MOE_KNS

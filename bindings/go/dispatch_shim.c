/* The standalone dispatcher's calls with tensors: bind the Go data, call, unbind (shim.h). */
#include "shim.h"

int32_t gomoe_dispatcher_dispatch(moe_dispatcher *d, DLTensor *x, void *xd, DLTensor *idx, void *idxd, DLTensor *p,
                                  void *pd, moe_dispatch **out, uintptr_t stream)
{
    int32_t st = moe_dispatcher_dispatch(d, gomoe_bind(x, xd), gomoe_bind(idx, idxd), gomoe_bind(p, pd), out,
                                         (void *)stream);
    gomoe_unbind(x, idx, p, NULL);
    return st;
}

int32_t gomoe_dispatch_rows(const moe_dispatch *h, DLTensor *xr, void *xrd, DLTensor *rp, void *rpd, DLTensor *tpe,
                            void *tped)
{
    int32_t st = moe_dispatch_rows(h, gomoe_bind(xr, xrd), gomoe_bind(rp, rpd), gomoe_bind(tpe, tped));
    gomoe_unbind(xr, rp, tpe, NULL);
    return st;
}

int32_t gomoe_dispatch_combine(moe_dispatch *h, DLTensor *yr, void *yrd, DLTensor *y, void *yd, uintptr_t stream)
{
    int32_t st = moe_dispatch_combine(h, gomoe_bind(yr, yrd), gomoe_bind(y, yd), (void *)stream);
    gomoe_unbind(yr, y, NULL, NULL);
    return st;
}

int32_t gomoe_dispatch_combine_backward(moe_dispatch *h, DLTensor *dy, void *dyd, DLTensor *dyr, void *dyrd,
                                        DLTensor *drp, void *drpd, uintptr_t stream)
{
    int32_t st = moe_dispatch_combine_backward(h, gomoe_bind(dy, dyd), gomoe_bind(dyr, dyrd), gomoe_bind(drp, drpd),
                                               (void *)stream);
    gomoe_unbind(dy, dyr, drp, NULL);
    return st;
}

int32_t gomoe_dispatch_backward(moe_dispatch *h, DLTensor *dxr, void *dxrd, DLTensor *drp, void *drpd, DLTensor *dx,
                                void *dxd, DLTensor *dp, void *dpd, uintptr_t stream)
{
    int32_t st = moe_dispatch_backward(h, gomoe_bind(dxr, dxrd), gomoe_bind(drp, drpd), gomoe_bind(dx, dxd),
                                       gomoe_bind(dp, dpd), (void *)stream);
    gomoe_unbind(dxr, drp, dx, dp);
    return st;
}

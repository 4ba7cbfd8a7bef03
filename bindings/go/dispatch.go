package moe

/*
#include "shim.h"
*/
import "C"

import "runtime"

// Dispatch is one routing decision in flight: Rows, then Combine, CombineBackward and Backward, in
// that order (collective calls: every rank of the EP comm in the same order).
type Dispatch struct {
	ptr *C.moe_dispatch
	g   *guard
}

// Close destroys the handle (idempotent).
func (h *Dispatch) Close() error {
	if h == nil {
		return nil
	}
	closeOn(h.g, &h.ptr, func(p *C.moe_dispatch) { C.moe_dispatch_destroy(p) })
	runtime.SetFinalizer(h, nil)
	return nil
}

func (h *Dispatch) call(f func(*C.moe_dispatch) C.int32_t) error {
	if h == nil {
		return goError(StatusInvalidArgument, "moe.Dispatch is nil")
	}
	err := callOn(h.g, &h.ptr, "moe.Dispatch", f)
	runtime.KeepAlive(h)
	return err
}

// DispatchInfo counts this rank's rows.
type DispatchInfo struct {
	Rows    int64 // Rx: rows received by the local experts, padding included
	Dropped int64 // assignments dropped by capacity
	Padded  int64 // padding rows added
}

// Info returns the row counts.
func (h *Dispatch) Info() (DispatchInfo, error) {
	var r, d, p C.int64_t
	err := h.call(func(ptr *C.moe_dispatch) C.int32_t { return C.moe_dispatch_info(ptr, &r, &d, &p) })
	return DispatchInfo{Rows: int64(r), Dropped: int64(d), Padded: int64(p)}, err
}

// Rows copies out x_rows [Rx,H], row_probs [Rx] and tokens_per_expert [E_local] (Int64); any may
// be the zero Tensor.
func (h *Dispatch) Rows(xRows, rowProbs, tokensPerExpert Tensor) error {
	var ct cTensors
	defer ct.free()
	cx, err := ct.add("x_rows", xRows)
	if err != nil {
		return err
	}
	cp, err := ct.add("row_probs", rowProbs)
	if err != nil {
		return err
	}
	ce, err := ct.add("tokens_per_expert", tokensPerExpert)
	if err != nil {
		return err
	}
	err = h.call(func(p *C.moe_dispatch) C.int32_t {
		return C.gomoe_dispatch_rows(p, cx, xRows.data, cp, rowProbs.data, ce, tokensPerExpert.data)
	})
	runtime.KeepAlive(xRows)
	runtime.KeepAlive(rowProbs)
	runtime.KeepAlive(tokensPerExpert)
	return err
}

// Combine is collective: y [T,H] = the (weighted) sum of each token's expert rows y_rows [Rx,H].
func (h *Dispatch) Combine(yRows, y Tensor) error {
	return h.CombineOn(yRows, y, DefaultStream)
}

// CombineOn is Combine ordered on stream.
func (h *Dispatch) CombineOn(yRows, y Tensor, stream Stream) error {
	var ct cTensors
	defer ct.free()
	cr, err := ct.add("y_rows", yRows)
	if err != nil {
		return err
	}
	cy, err := ct.add("y", y)
	if err != nil {
		return err
	}
	err = h.call(func(p *C.moe_dispatch) C.int32_t {
		return C.gomoe_dispatch_combine(p, cr, yRows.data, cy, y.data, C.uintptr_t(stream))
	})
	runtime.KeepAlive(yRows)
	runtime.KeepAlive(y)
	return err
}

// CombineBackward is collective: dy [T,H] -> dy_rows [Rx,H] and d_row_probs [Rx] (may be the zero
// Tensor).
func (h *Dispatch) CombineBackward(dy, dyRows, dRowProbs Tensor) error {
	return h.CombineBackwardOn(dy, dyRows, dRowProbs, DefaultStream)
}

// CombineBackwardOn is CombineBackward ordered on stream.
func (h *Dispatch) CombineBackwardOn(dy, dyRows, dRowProbs Tensor, stream Stream) error {
	var ct cTensors
	defer ct.free()
	cdy, err := ct.add("dy", dy)
	if err != nil {
		return err
	}
	cr, err := ct.add("dy_rows", dyRows)
	if err != nil {
		return err
	}
	cp, err := ct.add("d_row_probs", dRowProbs)
	if err != nil {
		return err
	}
	err = h.call(func(p *C.moe_dispatch) C.int32_t {
		return C.gomoe_dispatch_combine_backward(p, cdy, dy.data, cr, dyRows.data, cp, dRowProbs.data,
			C.uintptr_t(stream))
	})
	runtime.KeepAlive(dy)
	runtime.KeepAlive(dyRows)
	runtime.KeepAlive(dRowProbs)
	return err
}

// Backward is collective: dx_rows [Rx,H] and d_row_probs [Rx] (zero Tensor = 0) -> dx [T,H] and
// dprobs [T,K] (may be the zero Tensor).
func (h *Dispatch) Backward(dxRows, dRowProbs, dx, dprobs Tensor) error {
	return h.BackwardOn(dxRows, dRowProbs, dx, dprobs, DefaultStream)
}

// BackwardOn is Backward ordered on stream.
func (h *Dispatch) BackwardOn(dxRows, dRowProbs, dx, dprobs Tensor, stream Stream) error {
	var ct cTensors
	defer ct.free()
	cr, err := ct.add("dx_rows", dxRows)
	if err != nil {
		return err
	}
	crp, err := ct.add("d_row_probs", dRowProbs)
	if err != nil {
		return err
	}
	cdx, err := ct.add("dx", dx)
	if err != nil {
		return err
	}
	cdp, err := ct.add("dprobs", dprobs)
	if err != nil {
		return err
	}
	err = h.call(func(p *C.moe_dispatch) C.int32_t {
		return C.gomoe_dispatch_backward(p, cr, dxRows.data, crp, dRowProbs.data, cdx, dx.data, cdp, dprobs.data,
			C.uintptr_t(stream))
	})
	runtime.KeepAlive(dxRows)
	runtime.KeepAlive(dRowProbs)
	runtime.KeepAlive(dx)
	runtime.KeepAlive(dprobs)
	return err
}

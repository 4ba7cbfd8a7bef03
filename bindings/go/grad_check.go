package moe

/*
#include "shim.h"
*/
import "C"

// NonfiniteKind is a MOE_NONFINITE_KIND_* value: what a non-finite value is.
type NonfiniteKind int32

// Kinds of non-finite values.
const (
	NonfiniteNone   NonfiniteKind = C.MOE_NONFINITE_KIND_NONE // no non-finite value was found
	NonfiniteNaN    NonfiniteKind = C.MOE_NONFINITE_KIND_NAN
	NonfinitePosInf NonfiniteKind = C.MOE_NONFINITE_KIND_POS_INF
	NonfiniteNegInf NonfiniteKind = C.MOE_NONFINITE_KIND_NEG_INF
)

// NonfiniteReport mirrors moe_nonfinite_report: what CheckGradients found. "First" is in scan order
// (slots, then experts, then elements).
type NonfiniteReport struct {
	NumNonfinite int64         // non-finite gradient values over every slot
	NumNaN       int64         // of which NaN
	NumExperts   int32         // this rank's experts whose FC1 or FC2 gradient holds any
	NumSlots     int32         // slots whose gradient holds any
	FirstSlot    ParamSlot     // slot of the first value; -1 when none
	FirstExpert  int32         // its global expert id; -1 for the router and shared slots, and when none
	FirstIndex   int64         // flat index within the expert's block of the slot (the whole slot for expert -1); -1 when none
	FirstKind    NonfiniteKind // NonfiniteNone when none
}

// Found reports whether some gradient holds NaN or Inf: the optimizer step should be skipped.
func (r NonfiniteReport) Found() bool { return r.NumNonfinite > 0 }

// CheckGradients is the "found inf" check before the optimizer step (moe_layer_check_gradients, as
// AMP's GradScaler does): it scans every gradient slot for NaN and Inf and reports how many, in how
// many experts, and where the first is. The gradients are not changed.
func (l *Layer) CheckGradients() (NonfiniteReport, error) { return l.CheckGradientsOn(DefaultStream) }

// CheckGradientsOn is CheckGradients after the work queued on stream.
func (l *Layer) CheckGradientsOn(stream Stream) (NonfiniteReport, error) {
	var c C.moe_nonfinite_report
	C.moe_nonfinite_report_init(&c, C.sizeof_moe_nonfinite_report)
	err := l.call(func(p *C.moe_layer) C.int32_t { return C.gomoe_layer_check_gradients(p, &c, C.uintptr_t(stream)) })
	if err != nil {
		return NonfiniteReport{}, err
	}
	return NonfiniteReport{NumNonfinite: int64(c.num_nonfinite), NumNaN: int64(c.num_nan),
		NumExperts: int32(c.num_experts), NumSlots: int32(c.num_slots), FirstSlot: ParamSlot(c.first_slot),
		FirstExpert: int32(c.first_expert), FirstIndex: int64(c.first_index), FirstKind: NonfiniteKind(c.first_kind)}, nil
}

package moe

/*
#include "shim.h"
*/
import "C"

import "runtime"

// MergedStep mirrors moe_merged_step: the parts of one Layer.ForwardBackward call, the steady state
// of a 1F1B pipeline. A nil step leaves its part out (the zero MergedStep runs nothing); the steps
// must be distinct steps of the layer.
type MergedStep struct {
	// ForwardStep, X, Y: the forward of the next micro-batch, as Layer.Forward(step, x, y).
	ForwardStep *Step
	X, Y        Tensor
	// BackwardStep, DY, DX: the backward of an earlier micro-batch, as Layer.Backward(step, dy, dx);
	// the step holds a training forward.
	BackwardStep *Step
	DY, DX       Tensor
	// WeightsStep is a step whose weight gradients were deferred (an earlier call with
	// DeferWeightGrads, or Layer.BackwardData): they are added in this call, where both halves wait.
	WeightsStep *Step
	// DeferWeightGrads (MOE_MERGED_DEFER_WEIGHT_GRADS) runs the backward part's data half only: its
	// step keeps the weight gradients pending for a later call's WeightsStep (or BackwardWeights).
	DeferWeightGrads bool
}

// ForwardBackward runs the parts of args as one call (moe_layer_forward_backward): whenever one half
// waits for an expert-parallel exchange, the other computes. Y, DX, every gradient, the losses,
// routing statistics and expert counts are bitwise those of the separate calls
// BackwardWeights(WeightsStep), Forward(ForwardStep, X, Y), BackwardData(BackwardStep, DY, DX) and,
// unless DeferWeightGrads, BackwardWeights(BackwardStep). Every argument is checked before anything
// runs; on an error each part either completed or left its step and outputs as they were.
func (l *Layer) ForwardBackward(args MergedStep) error {
	return l.ForwardBackwardOn(args, DefaultStream)
}

// ForwardBackwardOn is ForwardBackward ordered on stream (on CUDA the forward half runs on a second
// stream of the layer, joined back into stream before the call returns).
func (l *Layer) ForwardBackwardOn(args MergedStep, stream Stream) error {
	for _, p := range []struct {
		name string
		step *Step
	}{{"ForwardStep", args.ForwardStep}, {"BackwardStep", args.BackwardStep}, {"WeightsStep", args.WeightsStep}} {
		if p.step != nil && p.step.closed() {
			// a closed step's NULL would silently leave its part out
			return goError(StatusInvalidArgument, "MergedStep.%s: used after Close", p.name)
		}
	}
	var ct cTensors
	defer ct.free()
	var cs [4]*C.DLTensor
	for i, t := range []struct {
		name string
		t    Tensor
	}{{"x", args.X}, {"y", args.Y}, {"dy", args.DY}, {"dx", args.DX}} {
		c, err := ct.add(t.name, t.t)
		if err != nil {
			return err
		}
		cs[i] = c
	}
	flags := C.int32_t(0)
	if args.DeferWeightGrads {
		flags |= C.MOE_MERGED_DEFER_WEIGHT_GRADS
	}
	err := l.call(func(p *C.moe_layer) C.int32_t {
		return C.gomoe_layer_forward_backward(p, args.ForwardStep.handle(), cs[0], args.X.data, cs[1], args.Y.data,
			args.BackwardStep.handle(), cs[2], args.DY.data, cs[3], args.DX.data, args.WeightsStep.handle(), flags,
			C.uintptr_t(stream))
	})
	runtime.KeepAlive(args.X)
	runtime.KeepAlive(args.Y)
	runtime.KeepAlive(args.DY)
	runtime.KeepAlive(args.DX)
	runtime.KeepAlive(args.ForwardStep)
	runtime.KeepAlive(args.BackwardStep)
	runtime.KeepAlive(args.WeightsStep)
	return err
}

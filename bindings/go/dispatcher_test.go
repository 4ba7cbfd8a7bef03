package moe

import (
	"errors"
	"testing"
)

// The standalone dispatcher on one rank, fed the fixture's routing: x_rows are the tokens grouped
// by expert (ascending; tokens ascending within an expert), combine of y_rows = 2 x_rows gives
// 2 sum_k p_tk x_t, and the backward calls match their closed forms.
func TestDispatcherOneRank(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	calls := 0
	hooks, err := NewHooksComm(ctx, nil, selfHooks(&calls))
	mustOK(t, "NewHooksComm", err)
	defer hooks.Close()
	for _, ep := range []*Comm{nil, hooks} {
		name := "no comm"
		if ep != nil {
			name = "Go hooks comm"
		}
		t.Run(name, func(t *testing.T) { checkDispatcher(t, ctx, ep) })
	}
	// (a one-rank group exchanges nothing, so the hooks need not run here; TestHooksCommLayer sees
	// them called)
	// the dispatchers are closed: the last reference to the hooks comm is the test's
	mustOK(t, "Comm.Close", hooks.Close())
	checkHooksReleased(t)
}

func checkDispatcher(t *testing.T, ctx *Context, ep *Comm) {
	cfg := NewDispatcherConfig()
	cfg.Hidden, cfg.NumExperts, cfg.TopK = fxH, fxE, fxK
	d, err := NewDispatcher(ctx, cfg, ep)
	mustOK(t, "NewDispatcher", err)
	defer d.Close()
	if n, first, err := d.LocalExperts(); err != nil || n != fxE || first != 0 {
		t.Fatalf("LocalExperts = %d, %d, %v", n, first, err)
	}
	x, idx, p := fixF32(t, "x"), fixI64(t, "expert_indices"), fixF32(t, "probs")
	h, err := d.Dispatch(Float32(x, fxT, fxH), Int64(idx, fxT, fxK), Float32(p, fxT, fxK))
	mustOK(t, "Dispatch", err)
	defer h.Close()
	mustOK(t, "Dispatcher.Close while its dispatch is open", d.Close())

	// the expected row order: expert ascending, then token ascending
	type row struct{ tok, k int }
	var rows []row
	for e := int64(0); e < fxE; e++ {
		for tok := 0; tok < fxT; tok++ {
			for k := 0; k < fxK; k++ {
				if idx[tok*fxK+k] == e {
					rows = append(rows, row{tok, k})
				}
			}
		}
	}
	info, err := h.Info()
	mustOK(t, "Info", err)
	if info.Rows != int64(len(rows)) || info.Dropped != 0 || info.Padded != 0 {
		t.Fatalf("Info = %+v, want %d rows", info, len(rows))
	}
	R := len(rows)
	xRows, rowProbs, tpe := make([]float32, R*fxH), make([]float32, R), make([]int64, fxE)
	mustOK(t, "Rows", h.Rows(Float32(xRows, int64(R), fxH), Float32(rowProbs), Int64(tpe)))
	expectI64(t, "tokens_per_expert", tpe, fixI64(t, "tokens_per_expert"))
	wantX, wantP := make([]float32, R*fxH), make([]float32, R)
	for r, rw := range rows {
		copy(wantX[r*fxH:(r+1)*fxH], x[rw.tok*fxH:(rw.tok+1)*fxH])
		wantP[r] = p[rw.tok*fxK+rw.k]
	}
	expectF32(t, "x_rows", xRows, wantX)
	expectF32(t, "row_probs", rowProbs, wantP)

	// combine: y_rows = 2 x_rows  ->  y[t] = 2 sum_k p_tk x_t
	yRows := make([]float32, R*fxH)
	for i := range yRows {
		yRows[i] = 2 * xRows[i]
	}
	y := make([]float32, fxT*fxH)
	mustOK(t, "Combine", h.Combine(Float32(yRows, int64(R), fxH), Float32(y, fxT, fxH)))
	wantY := make([]float32, fxT*fxH)
	for tok := 0; tok < fxT; tok++ {
		s := float64(p[tok*fxK]) + float64(p[tok*fxK+1])
		for j := 0; j < fxH; j++ {
			wantY[tok*fxH+j] = float32(2 * s * float64(x[tok*fxH+j]))
		}
	}
	expectF32(t, "y", y, wantY)

	// combine backward: dy_rows = p dy[t], d_row_probs = <dy[t], y_rows[r]>
	dy := fixF32(t, "dy")
	dyRows, dRowProbs := make([]float32, R*fxH), make([]float32, R)
	mustOK(t, "CombineBackward", h.CombineBackward(Float32(dy, fxT, fxH), Float32(dyRows, int64(R), fxH),
		Float32(dRowProbs)))
	wantDyRows, wantDRP := make([]float32, R*fxH), make([]float32, R)
	for r, rw := range rows {
		var dot float64
		for j := 0; j < fxH; j++ {
			g := dy[rw.tok*fxH+j]
			wantDyRows[r*fxH+j] = wantP[r] * g
			dot += float64(g) * float64(yRows[r*fxH+j])
		}
		wantDRP[r] = float32(dot)
	}
	expectF32(t, "dy_rows", dyRows, wantDyRows)
	expectF32(t, "d_row_probs", dRowProbs, wantDRP)

	// backward: dx[t] = sum of t's rows, dprobs[t,k] = d_row_probs of (t,k)'s row
	dx, dprobs := make([]float32, fxT*fxH), make([]float32, fxT*fxK)
	mustOK(t, "Backward", h.Backward(Float32(dyRows, int64(R), fxH), Float32(dRowProbs), Float32(dx, fxT, fxH),
		Float32(dprobs, fxT, fxK)))
	wantDx, wantDp := make([]float32, fxT*fxH), make([]float32, fxT*fxK)
	for r, rw := range rows {
		for j := 0; j < fxH; j++ {
			wantDx[rw.tok*fxH+j] += wantDyRows[r*fxH+j]
		}
		wantDp[rw.tok*fxK+rw.k] = wantDRP[r]
	}
	expectF32(t, "dx", dx, wantDx)
	expectF32(t, "dprobs", dprobs, wantDp)
	mustOK(t, "Dispatch.Close", h.Close())
	mustOK(t, "Dispatch.Close again", h.Close())
	if _, err := h.Info(); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("Info after Close: %v", err)
	}
}

func TestDispatcherErrors(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	cfg := NewDispatcherConfig()
	cfg.Hidden, cfg.NumExperts, cfg.TopK = fxH, fxE, 5
	if _, err := NewDispatcher(ctx, cfg, nil); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("top_k 5 of 4 experts: %v", err)
	}
	cfg.TopK = fxK
	d, err := NewDispatcher(ctx, cfg, nil)
	mustOK(t, "NewDispatcher", err)
	defer d.Close()
	x := make([]float32, fxT*fxH)
	bad := []int64{0, 0, 1, 2, 3, 1, 0, 2, 1, 3, 2, 0} // token 0 names expert 0 twice
	if _, err := d.Dispatch(Float32(x, fxT, fxH), Int64(bad, fxT, fxK), Tensor{}); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("duplicate expert: %v", err)
	}
	out := []int64{0, 1, 1, 2, 3, 4, 0, 2, 1, 3, 2, 0} // expert 4 of 4
	if _, err := d.Dispatch(Float32(x, fxT, fxH), Int64(out, fxT, fxK), Tensor{}); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("expert id 4: %v", err)
	}
}

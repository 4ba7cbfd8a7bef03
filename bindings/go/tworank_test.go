package moe

// Expert parallelism over two ranks (goroutines, each with its own Context) connected by host-hook
// comms written in Go. Like tests/mpi/test_layer_ep.c: EP = the hooks comm, Aux = DP = the same comm
// (each rank holds different tokens), ETP / EDP = one rank; the gathered y / dx, the aux losses summed
// over ranks, every rank's router gradient after ReduceGrads and each rank's expert-gradient shard must
// match one single-rank layer run on the whole batch.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	trT, trH, trF, trE, trK = 10, 8, 16, 4, 2
	trTol                   = 1e-5
	trTimeout               = 30 * time.Second // generous: failures are signalled by abort, not by this
)

// trExchange is an in-process collective library: every collective is one round in which each rank
// posts one block per destination and reads the blocks addressed to it. A failing hook aborts it, so
// the peers' hooks fail too instead of waiting forever; a deadline catches a peer that never arrives.
type trExchange struct {
	mu      sync.Mutex
	size    int
	blocks  [][][]byte // blocks[src][dst] of this round
	posted  []bool
	readers int // ranks that have read this round; the last one clears it
	aborted string
	timeout time.Duration
	changed chan struct{} // closed (and replaced) on every change: a broadcast with a timeout
}

func newTrExchange(size int, timeout time.Duration) *trExchange {
	return &trExchange{size: size, blocks: make([][][]byte, size), posted: make([]bool, size), timeout: timeout,
		changed: make(chan struct{})}
}

func (x *trExchange) notifyLocked() {
	close(x.changed)
	x.changed = make(chan struct{})
}

// abort makes every later round, on every rank, fail with why.
func (x *trExchange) abort(why string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.aborted == "" {
		x.aborted = why
	}
	x.notifyLocked()
}

func (x *trExchange) abortedWhy() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.aborted
}

// setTimeout also applies to rounds already waiting.
func (x *trExchange) setTimeout(d time.Duration) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.timeout = d
	x.notifyLocked()
}

func (x *trExchange) waitLocked(rank int, start time.Time, ready func() bool) error {
	for {
		if x.aborted != "" {
			return fmt.Errorf("rank %d: exchange aborted (%s)", rank, x.aborted)
		}
		if ready() {
			return nil
		}
		left := time.Until(start.Add(x.timeout))
		if left <= 0 {
			why := fmt.Sprintf("rank %d: no peer after %v", rank, x.timeout)
			x.aborted = why
			x.notifyLocked()
			return errors.New(why)
		}
		ch := x.changed
		x.mu.Unlock()
		timer := time.NewTimer(left)
		select {
		case <-ch:
		case <-timer.C:
		}
		timer.Stop()
		x.mu.Lock()
	}
}

// round sends blocks[dst] to each rank dst and returns the block each rank sent to rank.
func (x *trExchange) round(rank int, blocks [][]byte) ([][]byte, error) {
	start := time.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	// a fast rank may arrive before the slow one has read the previous round
	if err := x.waitLocked(rank, start, func() bool { return !x.posted[rank] }); err != nil {
		return nil, err
	}
	x.blocks[rank], x.posted[rank] = blocks, true
	x.notifyLocked()
	all := func() bool {
		for _, p := range x.posted {
			if !p {
				return false
			}
		}
		return true
	}
	if err := x.waitLocked(rank, start, all); err != nil {
		return nil, err
	}
	got := make([][]byte, x.size)
	for src := range got {
		got[src] = append([]byte(nil), x.blocks[src][rank]...)
	}
	if x.readers++; x.readers == x.size {
		for r := range x.posted {
			x.blocks[r], x.posted[r] = nil, false
		}
		x.readers = 0
		x.notifyLocked()
	}
	return got, nil
}

// trCounts are the calls of one rank's hooks; "peer" calls moved bytes to or from another rank.
type trCounts struct {
	a2a, a2aPeer, ag, agPeer, reduce int64
}

// trFault breaks a rank's AllToAllV / AllGatherV hooks.
type trFault int

const (
	faultNone trFault = iota
	faultErr
	faultPanic
)

// guarded runs a hook; an error or a panic aborts the exchange so the peers fail too.
func (x *trExchange) guarded(f func() error) (err error) {
	done := false
	defer func() {
		if !done {
			x.abort("a hook panicked") // the panic goes on to the binding, which reports it
		}
	}()
	err = f()
	done = true
	if err != nil {
		x.abort(err.Error())
	}
	return err
}

func (f trFault) inject(rank int, hook string) error {
	switch f {
	case faultErr:
		return fmt.Errorf("rank %d: injected %s failure", rank, hook)
	case faultPanic:
		panic(fmt.Sprintf("rank %d: injected %s panic", rank, hook))
	}
	return nil
}

// place copies each rank's block to its offset, checking the announced size.
func place(recv []byte, got [][]byte, bytes, offsets []int64) error {
	for src, b := range got {
		if int64(len(b)) != bytes[src] {
			return fmt.Errorf("rank %d sent %d bytes, %d expected", src, len(b), bytes[src])
		}
		copy(recv[offsets[src]:offsets[src]+bytes[src]], b) // empty blocks too: every offset is sliceable
	}
	return nil
}

// sumInto adds the ranks' buffers in rank order (the same order on every rank: equal results).
func sumInto(buf []byte, got [][]byte, dtype DType) error {
	for _, b := range got {
		if len(b) != len(buf) {
			return fmt.Errorf("all_reduce: a rank sent %d bytes, %d expected", len(b), len(buf))
		}
	}
	le := binary.LittleEndian
	switch dtype {
	case DTypeFloat32:
		for i := 0; i < len(buf); i += 4 {
			s := math.Float32frombits(le.Uint32(got[0][i:]))
			for _, b := range got[1:] {
				s += math.Float32frombits(le.Uint32(b[i:]))
			}
			le.PutUint32(buf[i:], math.Float32bits(s))
		}
	case DTypeFloat64:
		for i := 0; i < len(buf); i += 8 {
			s := math.Float64frombits(le.Uint64(got[0][i:]))
			for _, b := range got[1:] {
				s += math.Float64frombits(le.Uint64(b[i:]))
			}
			le.PutUint64(buf[i:], math.Float64bits(s))
		}
	case DTypeInt64:
		for i := 0; i < len(buf); i += 8 {
			s := int64(le.Uint64(got[0][i:]))
			for _, b := range got[1:] {
				s += int64(le.Uint64(b[i:]))
			}
			le.PutUint64(buf[i:], uint64(s))
		}
	default:
		return fmt.Errorf("all_reduce: dtype %d", dtype)
	}
	return nil
}

func peerBytes(rank int, b []int64) (n int64) {
	for r, v := range b {
		if r != rank {
			n += v
		}
	}
	return n
}

func repeat(b []byte, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = append([]byte(nil), b...)
	}
	return out
}

// trHooks are rank's collectives over x (the machine is little-endian, like every libmoe target).
func trHooks(rank, size int, x *trExchange, c *trCounts, fault trFault) CommHooks {
	return CommHooks{
		Rank: rank, Size: size,
		AllToAllV: func(send []byte, sb, so []int64, recv []byte, rb, ro []int64) error {
			return x.guarded(func() error {
				if err := fault.inject(rank, "all_to_all_v"); err != nil {
					return err
				}
				atomic.AddInt64(&c.a2a, 1)
				if peerBytes(rank, sb)+peerBytes(rank, rb) > 0 {
					atomic.AddInt64(&c.a2aPeer, 1)
				}
				blocks := make([][]byte, size)
				for d := range blocks {
					blocks[d] = append([]byte(nil), send[so[d]:so[d]+sb[d]]...)
				}
				got, err := x.round(rank, blocks)
				if err != nil {
					return err
				}
				return place(recv, got, rb, ro)
			})
		},
		AllGatherV: func(send, recv []byte, rb, ro []int64) error {
			return x.guarded(func() error {
				if err := fault.inject(rank, "all_gather_v"); err != nil {
					return err
				}
				atomic.AddInt64(&c.ag, 1)
				if peerBytes(rank, rb) > 0 || (size > 1 && len(send) > 0) {
					atomic.AddInt64(&c.agPeer, 1)
				}
				got, err := x.round(rank, repeat(send, size))
				if err != nil {
					return err
				}
				return place(recv, got, rb, ro)
			})
		},
		AllReduce: func(buf []byte, count int64, dtype DType) error {
			return x.guarded(func() error {
				atomic.AddInt64(&c.reduce, 1)
				got, err := x.round(rank, repeat(buf, size))
				if err != nil {
					return err
				}
				return sumInto(buf, got, dtype)
			})
		},
		Broadcast: func(buf []byte, root int) error {
			return x.guarded(func() error {
				if root < 0 || root >= size {
					return fmt.Errorf("broadcast root %d", root)
				}
				blocks := make([][]byte, size)
				if rank == root {
					blocks = repeat(buf, size)
				}
				got, err := x.round(rank, blocks)
				if err != nil {
					return err
				}
				if len(got[root]) != len(buf) {
					return fmt.Errorf("broadcast: root sent %d bytes, %d expected", len(got[root]), len(buf))
				}
				copy(buf, got[root])
				return nil
			})
		},
		Barrier: func() error {
			return x.guarded(func() error { _, err := x.round(rank, make([][]byte, size)); return err })
		},
	}
}

// twoRanks runs f(0) and f(1) on two goroutines.
func twoRanks(f func(rank int)) {
	var wg sync.WaitGroup
	wg.Add(2)
	for r := 0; r < 2; r++ {
		go func(r int) {
			defer wg.Done()
			f(r)
		}(r)
	}
	wg.Wait()
}

func trConfig() LayerConfig {
	cfg := NewLayerConfig()
	cfg.HiddenSize, cfg.FFNHiddenSize, cfg.NumExperts, cfg.TopK = trH, trF, trE, trK
	cfg.Activation = ActSwiGLU
	cfg.ScoreFunction = ScoreSoftmax
	cfg.AuxLossType, cfg.AuxLossCoeff = AuxSwitch, 0.01
	cfg.ParamDType = DTypeFloat32
	cfg.Seed = 1234
	return cfg
}

// trData: n deterministic values in [-1, 1) (splitmix64).
func trData(n int, seed uint64) []float32 {
	out := make([]float32, n)
	for i := range out {
		z := seed*0x9E3779B97F4A7C15 + uint64(i) + 1
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		z ^= z >> 31
		out[i] = float32(float64(z>>11)/(1<<53)*2 - 1)
	}
	return out
}

// relErr is ||a - b|| / ||b|| (||a - b|| when b is zero).
func relErr(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d, n float64
	for i := range a {
		d += (float64(a[i]) - float64(b[i])) * (float64(a[i]) - float64(b[i]))
		n += float64(b[i]) * float64(b[i])
	}
	if n > 0 {
		return math.Sqrt(d / n)
	}
	return math.Sqrt(d)
}

// trOut is what one layer produced for its tokens.
type trOut struct {
	y, dx, router, fc1, fc2 []float32
	aux                     float64
}

func gradOf(l *Layer, slot ParamSlot) ([]float32, error) {
	v, err := l.Grad(slot)
	if err != nil {
		return nil, err
	}
	defer v.Close()
	return append([]float32(nil), v.Float32()...), nil
}

// trTrain runs forward + backward + ReduceGrads of x / dy ([T, H]) and reads the gradients.
func trTrain(l *Layer, x, dy []float32) (o trOut, err error) {
	t := int64(len(x) / trH)
	o.y, o.dx = make([]float32, len(x)), make([]float32, len(x))
	step, err := NewStep(l, &StepConfig{Mode: StepTrain, AuxLossScale: 1})
	if err != nil {
		return o, err
	}
	defer step.Close()
	if err = l.Forward(step, Float32(x, t, trH), Float32(o.y, t, trH)); err != nil {
		return o, err
	}
	rs, err := step.RoutingStats()
	if err != nil {
		return o, err
	}
	o.aux = rs.AuxLoss
	if err = l.Backward(step, Float32(dy, t, trH), Float32(o.dx, t, trH)); err != nil {
		return o, err
	}
	if err = l.ReduceGrads(); err != nil {
		return o, err
	}
	if o.router, err = gradOf(l, ParamRouterWeight); err != nil {
		return o, err
	}
	if o.fc1, err = gradOf(l, ParamExpertFC1); err != nil {
		return o, err
	}
	o.fc2, err = gradOf(l, ParamExpertFC2)
	return o, err
}

func trReference(t *testing.T, x, dy []float32) trOut {
	ctx, err := NewContext(&ContextConfig{NumThreads: 1})
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	l, err := NewLayer(ctx, trConfig())
	mustOK(t, "NewLayer", err)
	defer l.Close()
	o, err := trTrain(l, x, dy)
	mustOK(t, "reference step", err)
	return o
}

// trRank is one rank: its own Context, a hooks comm over x, the EP = 2 layer and, unless build
// only, one training step on its slice.
func trRank(rank int, kind DispatcherKind, x *trExchange, c *trCounts, fault trFault, xs, dys []float32,
	buildOnly bool) (trOut, error) {
	ctx, err := NewContext(&ContextConfig{NumThreads: 1})
	if err != nil {
		return trOut{}, err
	}
	defer ctx.Close()
	comm, err := NewHooksComm(ctx, nil, trHooks(rank, 2, x, c, fault))
	if err != nil {
		return trOut{}, err
	}
	defer comm.Close()
	l, err := NewParallelLayer(ctx, trConfig(), ParallelConfig{EP: comm, Aux: comm, DP: comm, Dispatcher: kind})
	if err != nil {
		return trOut{}, err
	}
	defer l.Close()
	if buildOnly {
		return trOut{}, nil
	}
	return trTrain(l, xs, dys)
}

func checkTwoRankLayer(t *testing.T, kind DispatcherKind, t0 int) {
	name := fmt.Sprintf("%v split %d/%d", kind, t0, trT-t0)
	x, dy := trData(trT*trH, 11), trData(trT*trH, 12)
	want := trReference(t, x, dy)
	ex := newTrExchange(2, trTimeout)
	var counts [2]trCounts
	var got [2]trOut
	var errs [2]error
	cut := [3]int{0, t0 * trH, trT * trH}
	twoRanks(func(r int) {
		got[r], errs[r] = trRank(r, kind, ex, &counts[r], faultNone, x[cut[r]:cut[r+1]], dy[cut[r]:cut[r+1]], false)
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s: rank %d: %v (exchange: %s)", name, r, err, ex.abortedWhy())
		}
	}
	y := append(append([]float32(nil), got[0].y...), got[1].y...)
	dx := append(append([]float32(nil), got[0].dx...), got[1].dx...)
	if e := relErr(y, want.y); e >= trTol {
		t.Fatalf("%s: y differs by %.2e", name, e)
	}
	if e := relErr(dx, want.dx); e >= trTol {
		t.Fatalf("%s: dx differs by %.2e", name, e)
	}
	if aux := got[0].aux + got[1].aux; want.aux <= 0 || math.Abs(aux-want.aux)/want.aux >= trTol {
		t.Fatalf("%s: aux %g (summed over ranks) vs %g", name, aux, want.aux)
	}
	n1, n2 := trE/2*2*trF*trH, trE/2*trH*trF
	for r := range got {
		if e := relErr(got[r].router, want.router); e >= trTol {
			t.Fatalf("%s: rank %d router grad differs by %.2e", name, r, e)
		}
		// rank r holds experts [r*E/2, (r+1)*E/2)
		e1, e2 := relErr(got[r].fc1, want.fc1[r*n1:(r+1)*n1]), relErr(got[r].fc2, want.fc2[r*n2:(r+1)*n2])
		if e1 >= trTol || e2 >= trTol {
			t.Fatalf("%s: rank %d expert grads differ by %.2e / %.2e", name, r, e1, e2)
		}
		peer, calls := counts[r].a2aPeer, counts[r].a2a
		if kind == DispatcherAllGather {
			peer, calls = counts[r].agPeer, counts[r].ag
		}
		if peer == 0 || counts[r].reduce == 0 {
			t.Fatalf("%s: rank %d: %d exchanges, none moving bytes between ranks (%d all-reduces)", name, r, calls,
				counts[r].reduce)
		}
	}
	if why := ex.abortedWhy(); why != "" {
		t.Fatalf("%s: exchange aborted: %s", name, why)
	}
}

func TestTwoRankLayerAllToAll(t *testing.T) {
	checkTwoRankLayer(t, DispatcherAllToAll, 6)
	checkTwoRankLayer(t, DispatcherAllToAll, trT) // rank 1 has no tokens
}

func TestTwoRankLayerAllGather(t *testing.T) {
	checkTwoRankLayer(t, DispatcherAllGather, 6)
	checkTwoRankLayer(t, DispatcherAllGather, trT)
}

// trExperts: token g's two distinct experts, spread so that every expert gets rows.
func trExperts(g int) [2]int64 {
	a := g % trE
	return [2]int64{int64(a), int64((a + 1 + (g/trE)%(trE-1)) % trE)}
}

// dispatchRank dispatches rank's tokens [t0, t1), checks the rows its experts receive, and combines
// host experts y = 2x.
func dispatchRank(rank int, kind DispatcherKind, ex *trExchange, c *trCounts, x, probs []float32, idx []int64,
	t0, t1 int) ([]float32, error) {
	ctx, err := NewContext(&ContextConfig{NumThreads: 1})
	if err != nil {
		return nil, err
	}
	defer ctx.Close()
	comm, err := NewHooksComm(ctx, nil, trHooks(rank, 2, ex, c, faultNone))
	if err != nil {
		return nil, err
	}
	defer comm.Close()
	cfg := NewDispatcherConfig()
	cfg.Kind, cfg.Hidden, cfg.NumExperts, cfg.TopK = kind, trH, trE, trK
	d, err := NewDispatcher(ctx, cfg, comm)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if n, first, err := d.LocalExperts(); err != nil || n != trE/2 || first != rank*trE/2 {
		return nil, fmt.Errorf("LocalExperts = %d, %d, %v", n, first, err)
	}
	t := int64(t1 - t0)
	h, err := d.Dispatch(Float32(x[t0*trH:t1*trH], t, trH), Int64(idx[t0*trK:t1*trK], t, trK),
		Float32(probs[t0*trK:t1*trK], t, trK))
	if err != nil {
		return nil, err
	}
	defer h.Close()
	info, err := h.Info()
	if err != nil {
		return nil, err
	}
	rows, tpe := make([]float32, info.Rows*trH), make([]int64, trE/2)
	if err := h.Rows(Float32(rows, info.Rows, trH), Tensor{}, Int64(tpe, trE/2)); err != nil {
		return nil, err
	}
	// every global token routed to a local expert arrives, whichever rank holds it
	start := int64(0)
	for l, n := range tpe {
		e := int64(rank*trE/2 + l)
		var sources []int
		for g := 0; g < trT; g++ {
			if idx[g*trK] == e || idx[g*trK+1] == e {
				sources = append(sources, g)
			}
		}
		if int(n) != len(sources) {
			return nil, fmt.Errorf("expert %d received %d rows, %d tokens chose it", e, n, len(sources))
		}
		for r := start; r < start+n; r++ {
			found := false
			for _, g := range sources {
				found = found || relErr(rows[r*trH:(r+1)*trH], x[g*trH:(g+1)*trH]) == 0
			}
			if !found {
				return nil, fmt.Errorf("row %d of expert %d is no token of it", r, e)
			}
		}
		start += n
	}
	if start != info.Rows {
		return nil, fmt.Errorf("%d rows, tokens_per_expert sums to %d", info.Rows, start)
	}
	yRows := make([]float32, len(rows))
	for i, v := range rows {
		yRows[i] = 2 * v
	}
	y := make([]float32, t*trH)
	err = h.Combine(Float32(yRows, info.Rows, trH), Float32(y, t, trH))
	return y, err
}

func TestTwoRankDispatcher(t *testing.T) {
	for _, kind := range []DispatcherKind{DispatcherAllToAll, DispatcherAllGather} {
		x := trData(trT*trH, 21)
		probs := trData(trT*trK, 22)
		for i, p := range probs {
			probs[i] = 0.25 + 0.5*float32(math.Abs(float64(p)))
		}
		idx := make([]int64, 0, trT*trK)
		for g := 0; g < trT; g++ {
			e := trExperts(g)
			idx = append(idx, e[0], e[1])
		}
		ex := newTrExchange(2, trTimeout)
		var counts [2]trCounts
		var ys [2][]float32
		var errs [2]error
		cut := [3]int{0, 6, trT}
		twoRanks(func(r int) {
			ys[r], errs[r] = dispatchRank(r, kind, ex, &counts[r], x, probs, idx, cut[r], cut[r+1])
		})
		for r := 0; r < 2; r++ {
			mustOK(t, fmt.Sprintf("%v dispatcher rank %d", kind, r), errs[r])
			var want []float32
			for g := cut[r]; g < cut[r+1]; g++ {
				p := probs[g*trK] + probs[g*trK+1]
				for _, v := range x[g*trH : (g+1)*trH] {
					want = append(want, 2*p*v)
				}
			}
			if e := relErr(ys[r], want); e >= trTol {
				t.Fatalf("%v: rank %d combine differs by %.2e", kind, r, e)
			}
			if counts[r].a2aPeer+counts[r].agPeer == 0 {
				t.Fatalf("%v: rank %d's hooks moved no bytes between ranks", kind, r)
			}
		}
	}
}

// checkFault: rank 1's exchange hooks fail; both ranks must get StatusCallback, well before the
// deadline (the peer's hook sees the abort).
func checkFault(t *testing.T, fault trFault, kind DispatcherKind) {
	x, dy := trData(trT*trH, 11), trData(trT*trH, 12)
	ex := newTrExchange(2, trTimeout)
	var counts [2]trCounts
	var errs [2]error
	cut := [3]int{0, 6 * trH, trT * trH}
	start := time.Now()
	twoRanks(func(r int) {
		f := faultNone
		if r == 1 {
			f = fault
		}
		_, errs[r] = trRank(r, kind, ex, &counts[r], f, x[cut[r]:cut[r+1]], dy[cut[r]:cut[r+1]], false)
	})
	for r, err := range errs {
		if !errors.Is(err, StatusCallback) {
			t.Fatalf("fault %d %v: rank %d: %v, want StatusCallback", fault, kind, r, err)
		}
	}
	if time.Since(start) >= trTimeout {
		t.Fatalf("fault %d: the peer waited for the deadline instead of the abort", fault)
	}
	if ex.abortedWhy() == "" {
		t.Fatalf("fault %d: the exchange was never aborted", fault)
	}
}

func TestTwoRankFailingHook(t *testing.T) {
	checkFault(t, faultErr, DispatcherAllToAll)
	checkFault(t, faultErr, DispatcherAllGather)
	checkFault(t, faultPanic, DispatcherAllToAll)
}

// Rank 1 builds its layer and leaves: rank 0's hooks give up at the (shortened) deadline.
func TestTwoRankMissingPeer(t *testing.T) {
	x, dy := trData(trT*trH, 11), trData(trT*trH, 12)
	ex := newTrExchange(2, trTimeout)
	var counts [2]trCounts
	var errs [2]error
	twoRanks(func(r int) {
		_, errs[r] = trRank(r, DispatcherAllToAll, ex, &counts[r], faultNone, x[:6*trH], dy[:6*trH], r == 1)
		if r == 1 {
			ex.setTimeout(300 * time.Millisecond)
		}
	})
	mustOK(t, "rank 1 (build only)", errs[1])
	// StatusCallback, carrying the hook's own error (the exchange's reason)
	if !errors.Is(errs[0], StatusCallback) || !strings.Contains(ex.abortedWhy(), "rank 0: no peer") ||
		!strings.Contains(errs[0].Error(), "no peer") {
		t.Fatalf("rank 0 without its peer: %v (exchange: %q), want StatusCallback after rank 0's timeout", errs[0],
			ex.abortedWhy())
	}
}

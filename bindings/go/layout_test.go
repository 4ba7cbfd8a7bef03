package moe

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestLayoutWorkedExample checks docs/parallel.md's worked example: world 16, TP2 CP2 DP4, ETP2 EP4.
func TestLayoutWorkedExample(t *testing.T) {
	cfg := NewLayoutConfig()
	cfg.WorldSize, cfg.TP, cfg.CP, cfg.DP, cfg.ETP, cfg.EP = 16, 2, 2, 4, 2, 4
	l, err := NewLayout(cfg)
	mustOK(t, "NewLayout", err)
	defer l.Close()
	sizes, err := l.Sizes()
	mustOK(t, "Sizes", err)
	if want := (LayoutSizes{TP: 2, CP: 2, DP: 4, PP: 1, ETP: 2, EP: 4, EDP: 2}); sizes != want {
		t.Fatalf("Sizes = %+v, want %+v", sizes, want)
	}
	for _, c := range []struct {
		g       Group
		members []int32
		index   int
	}{
		{GroupTP, []int32{6, 7}, 0},
		{GroupCP, []int32{4, 6}, 1},
		{GroupDP, []int32{2, 6, 10, 14}, 1},
		{GroupEP, []int32{0, 2, 4, 6}, 3},
		{GroupEDP, []int32{6, 14}, 0},
		{GroupTPCP, []int32{4, 5, 6, 7}, 2},
	} {
		m, i, err := l.Group(6, c.g)
		mustOK(t, "Group", err)
		if !reflect.DeepEqual(m, c.members) || i != c.index {
			t.Fatalf("rank 6 group %d: %v index %d, want %v index %d", c.g, m, i, c.members, c.index)
		}
	}
	if _, _, err := l.Group(16, GroupTP); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("rank 16 of 16: %v", err)
	}
	mustOK(t, "Close", l.Close())
	mustOK(t, "Close again", l.Close())
	if _, err := l.Sizes(); !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("Sizes after Close: %v", err)
	}
}

func TestLayoutErrors(t *testing.T) {
	_, err := NewLayout(LayoutConfig{WorldSize: 8, TP: 2, Order: "tp-cp-ep-dp"})
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "order") {
		t.Fatalf("order without pp: %v", err)
	}
	_, err = NewLayout(LayoutConfig{WorldSize: 6, TP: 4})
	if !errors.Is(err, StatusInvalidArgument) {
		t.Fatalf("world 6 with TP 4: %v", err)
	}
}

// TestSelfCommSplitLayout: a one-rank world split by a one-rank layout.
func TestSelfCommSplitLayout(t *testing.T) {
	ctx, err := NewContext(nil)
	mustOK(t, "NewContext", err)
	defer ctx.Close()
	world, err := NewSelfComm(ctx, &CommConfig{TimeoutMS: 1000})
	mustOK(t, "NewSelfComm", err)
	defer world.Close()
	l, err := NewLayout(LayoutConfig{WorldSize: 1, Order: "ep-tp-cp-dp-pp"})
	mustOK(t, "NewLayout", err)
	defer l.Close()
	ep, err := world.SplitLayout(l, GroupEP)
	mustOK(t, "SplitLayout", err)
	defer ep.Close()
	if n, err := ep.Size(); err != nil || n != 1 {
		t.Fatalf("EP size %d, %v", n, err)
	}
	if k, _ := ep.Kind(); k != CommKindSelf {
		t.Fatalf("EP kind %v", k)
	}
	none, err := world.Split(-1, 0)
	if err != nil || none != nil {
		t.Fatalf("Split(-1) = %v, %v; want no comm", none, err)
	}
}

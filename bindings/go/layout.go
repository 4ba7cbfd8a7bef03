package moe

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// LayoutConfig mirrors moe_layout_config: attention sizes TP x CP x DP x PP and MoE sizes
// ETP x EP x EDP x PP over one world (Parallel Folding, docs/parallel.md). Zero means the default
// (1; DP derived from the world); Order "" means "tp-cp-ep-dp-pp".
type LayoutConfig struct {
	WorldSize      int32
	TP, CP, DP, PP int32
	ETP, EP        int32
	Order          string
}

// NewLayoutConfig returns the defaults of moe_layout_config_init.
func NewLayoutConfig() LayoutConfig {
	var c C.moe_layout_config
	C.moe_layout_config_init(&c, C.sizeof_moe_layout_config)
	return LayoutConfig{WorldSize: int32(c.world_size), TP: int32(c.tp), CP: int32(c.cp), DP: int32(c.dp),
		PP: int32(c.pp), ETP: int32(c.etp), EP: int32(c.ep)}
}

// Group is a MOE_GROUP_* value.
type Group int32

// The groups of a layout.
const (
	GroupTP     Group = C.MOE_GROUP_TP
	GroupCP     Group = C.MOE_GROUP_CP
	GroupDP     Group = C.MOE_GROUP_DP
	GroupPP     Group = C.MOE_GROUP_PP
	GroupETP    Group = C.MOE_GROUP_ETP
	GroupEP     Group = C.MOE_GROUP_EP
	GroupEDP    Group = C.MOE_GROUP_EDP
	GroupDPCP   Group = C.MOE_GROUP_DP_CP    // router / shared-expert gradient reduction
	GroupTPCP   Group = C.MOE_GROUP_TP_CP    // ranks sharing the same tokens: aux-loss counts
	GroupTPCPDP Group = C.MOE_GROUP_TP_CP_DP // expert-bias counts
)

// Layout maps every rank of a world to its groups. It belongs to no context.
type Layout struct {
	ptr *C.moe_layout
	g   *guard
}

// NewLayout checks cfg and builds the layout.
func NewLayout(cfg LayoutConfig) (*Layout, error) {
	var c C.moe_layout_config
	C.moe_layout_config_init(&c, C.sizeof_moe_layout_config)
	c.world_size = C.int32_t(cfg.WorldSize)
	c.tp, c.cp, c.dp, c.pp = C.int32_t(cfg.TP), C.int32_t(cfg.CP), C.int32_t(cfg.DP), C.int32_t(cfg.PP)
	c.etp, c.ep = C.int32_t(cfg.ETP), C.int32_t(cfg.EP)
	if cfg.Order != "" {
		// C memory: the config struct is passed to C and must not hold a Go pointer
		order := C.CString(cfg.Order)
		defer C.free(unsafe.Pointer(order))
		c.order = order
	}
	var ptr *C.moe_layout
	if err := callC(func() C.int32_t { return C.moe_layout_create(&c, &ptr) }); err != nil {
		return nil, err
	}
	l := &Layout{ptr: ptr, g: &guard{}}
	runtime.SetFinalizer(l, (*Layout).Close)
	return l, nil
}

// Close frees the layout (idempotent).
func (l *Layout) Close() error {
	if l == nil {
		return nil
	}
	closeOn(l.g, &l.ptr, func(p *C.moe_layout) { C.moe_layout_destroy(p) })
	runtime.SetFinalizer(l, nil)
	return nil
}

func (l *Layout) call(f func(*C.moe_layout) C.int32_t) error {
	if l == nil {
		return goError(StatusInvalidArgument, "moe.Layout is nil")
	}
	err := callOn(l.g, &l.ptr, "moe.Layout", f)
	runtime.KeepAlive(l)
	return err
}

// LayoutSizes are the dimensions with defaults resolved.
type LayoutSizes struct {
	TP, CP, DP, PP, ETP, EP, EDP int
}

// Sizes returns the resolved sizes.
func (l *Layout) Sizes() (LayoutSizes, error) {
	var tp, cp, dp, pp, etp, ep, edp C.int32_t
	err := l.call(func(p *C.moe_layout) C.int32_t {
		return C.moe_layout_sizes(p, &tp, &cp, &dp, &pp, &etp, &ep, &edp)
	})
	return LayoutSizes{TP: int(tp), CP: int(cp), DP: int(dp), PP: int(pp), ETP: int(etp), EP: int(ep),
		EDP: int(edp)}, err
}

// Group returns the members of rank's group (ascending) and rank's index among them.
func (l *Layout) Group(rank int, group Group) (members []int32, index int, err error) {
	var count, idx C.int32_t
	err = l.call(func(p *C.moe_layout) C.int32_t {
		return C.moe_layout_group(p, C.int32_t(rank), C.int32_t(group), nil, 0, &count, &idx)
	})
	if err != nil {
		return nil, 0, err
	}
	members = make([]int32, int(count))
	if count > 0 {
		err = l.call(func(p *C.moe_layout) C.int32_t {
			return C.moe_layout_group(p, C.int32_t(rank), C.int32_t(group), (*C.int32_t)(unsafe.Pointer(&members[0])),
				count, &count, &idx)
		})
	}
	if err != nil {
		return nil, 0, err
	}
	return members, int(idx), nil
}

// SplitLayout is collective over a world comm of the layout's size: the comm of this rank's group.
func (c *Comm) SplitLayout(layout *Layout, group Group) (*Comm, error) {
	var lp *C.moe_layout // NULL for a nil or closed Layout: the library names the argument
	if layout != nil {
		lp = layout.ptr
	}
	var ptr *C.moe_comm
	err := c.call(func(p *C.moe_comm) C.int32_t {
		return C.moe_comm_split_layout(p, lp, C.int32_t(group), &ptr)
	})
	runtime.KeepAlive(layout)
	if err != nil {
		return nil, err
	}
	return newComm(c.g, ptr), nil
}

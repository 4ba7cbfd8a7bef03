package moe

import (
	"errors"
	"strings"
	"testing"
)

// The library's struct sizes equal the ones this package was compiled with, and the names of the
// constants map both ways.
func TestStructSizes(t *testing.T) {
	for kind := StructContextConfig; kind <= StructMergedStep; kind++ {
		size, minSize, err := StructSize(kind)
		mustOK(t, "StructSize", err)
		name, ok := EnumName(EnumStruct, int64(kind))
		if !ok || !strings.HasPrefix(name, "MOE_STRUCT_") {
			t.Fatalf("EnumName(EnumStruct, %d) = %q, %v", kind, name, ok)
		}
		if size != HeaderStructSize(kind) || minSize > size || minSize <= 8 {
			t.Fatalf("%s: library %d (min %d), header %d", name, size, minSize, HeaderStructSize(kind))
		}
	}
	if _, min, _ := StructSize(StructLayerConfig); min != 136 { // the 0.1 layout
		t.Fatalf("moe_layer_config min size %d, want 136", min)
	}
	_, _, err := StructSize(StructMergedStep + 1)
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "kind") {
		t.Fatalf("unknown kind: %v", err)
	}
}

func TestEnumNames(t *testing.T) {
	slots := map[ParamSlot]string{ParamRouterWeight: "MOE_PARAM_ROUTER_WEIGHT", ParamExpertFC1: "MOE_PARAM_EXPERT_FC1",
		ParamExpertFC2: "MOE_PARAM_EXPERT_FC2", ParamExpertBias: "MOE_PARAM_EXPERT_BIAS"}
	for slot, want := range slots {
		if got, ok := EnumName(EnumParam, int64(slot)); !ok || got != want {
			t.Fatalf("EnumName(EnumParam, %d) = %q, want %q", slot, got, want)
		}
		if v, err := EnumValue(EnumParam, want); err != nil || v != int64(slot) {
			t.Fatalf("EnumValue(EnumParam, %q) = %d, %v", want, v, err)
		}
	}
	if got, _ := EnumName(EnumStepFlag, 1); got != "MOE_STEP_EXPLICIT_AUX_SCALE" {
		t.Fatalf("step flag name %q", got)
	}
	if _, ok := EnumName(EnumLayerRecompute, 3); ok {
		t.Fatal("a combination of bits has a name")
	}
	n := 0
	for ; ; n++ {
		if _, ok := EnumName(EnumFamilies, int64(n)); !ok {
			break
		}
	}
	if n != int(EnumMerged)+1 {
		t.Fatalf("%d families, want %d", n, EnumMerged+1)
	}
	if got, _ := EnumName(EnumMerged, 1); got != "MOE_MERGED_DEFER_WEIGHT_GRADS" {
		t.Fatalf("merged flag name %q", got)
	}
	if got, _ := EnumName(EnumComm, int64(CommKindModeled)); got != "MOE_COMM_MODELED" {
		t.Fatalf("modeled comm kind name %q", got)
	}
	_, err := EnumValue(EnumActivation, "MOE_SCORE_SIGMOID")
	if !errors.Is(err, StatusInvalidArgument) || !strings.Contains(err.Error(), "MOE_SCORE_SIGMOID") {
		t.Fatalf("a name of another family: %v", err)
	}
}

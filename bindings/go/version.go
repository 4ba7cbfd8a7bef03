package moe

// The library is found with -lmoe; the include and library directories come from the caller
// (CGO_CFLAGS="-I<repo>/abi" CGO_LDFLAGS="-L<build>") or from pkg-config (README.md).

/*
#cgo LDFLAGS: -lmoe
#include "shim.h"
*/
import "C"

// Feature bits of Features (MOE_FEATURE_*).
const (
	FeatureCPU      uint64 = C.MOE_FEATURE_CPU
	FeatureOpenMP   uint64 = C.MOE_FEATURE_OPENMP
	FeatureOpenBLAS uint64 = C.MOE_FEATURE_OPENBLAS
	FeatureOneDNN   uint64 = C.MOE_FEATURE_ONEDNN
	FeatureBF16     uint64 = C.MOE_FEATURE_BF16
	FeatureFP64     uint64 = C.MOE_FEATURE_FP64
	FeatureCUDA     uint64 = C.MOE_FEATURE_CUDA
	FeatureNCCL     uint64 = C.MOE_FEATURE_NCCL
	FeatureMPI      uint64 = C.MOE_FEATURE_MPI
	FeatureFP8      uint64 = C.MOE_FEATURE_FP8
)

// HeaderVersion is MOE_VERSION_NUMBER of the header this package was compiled against.
const HeaderVersion = C.MOE_VERSION_NUMBER

// Version returns the loaded library's version string, e.g. "0.2.0".
func Version() string { return C.GoString(C.moe_version_string()) }

// VersionNumber returns the loaded library's major*10000 + minor*100 + patch.
func VersionNumber() uint32 { return uint32(C.moe_version_number()) }

// Features returns the loaded library's Feature* bits.
func Features() uint64 { return uint64(C.moe_build_features()) }

# Host-side dependencies of the engine, gathered in one INTERFACE target `moe_deps`.
find_package(PkgConfig REQUIRED)
# Debian's dlpack package reports a wrong version: ask without one.
find_package(dlpack CONFIG REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS C)
# CPU GEMMs (chosen by measurement, bench/RESULTS.md "CPU GEMM library" and "Engine GEMM path"):
# oneDNN matmul for fp32 (and bf16 layers), OpenBLAS for the fp64 reference path (oneDNN has no f64).
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
# checkpoints (src/ckpt): safetensors headers are JSON (Jansson), tensors carry a CRC-32 (zlib)
pkg_check_modules(JANSSON REQUIRED IMPORTED_TARGET jansson)
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)
# oneDNN's CMake package (Debian: libdnnl-dev) requires OpenCL, because Debian builds oneDNN with
# the OCL GPU runtime; look for OpenCL first so that its absence says what to install instead of
# failing inside dnnl-config.cmake. (The engine uses only oneDNN's CPU engine.)
find_package(OpenCL QUIET)
if(NOT OpenCL_FOUND)
  message(FATAL_ERROR "oneDNN's CMake package needs OpenCL headers and loader (Debian: ocl-icd-opencl-dev)")
endif()
find_package(dnnl CONFIG REQUIRED)
find_library(MOE_MATH_LIB m)

add_library(moe_deps INTERFACE)
target_link_libraries(moe_deps INTERFACE dlpack::dlpack OpenMP::OpenMP_C DNNL::dnnl PkgConfig::OPENBLAS PkgConfig::JANSSON PkgConfig::ZLIB ${MOE_MATH_LIB})
set(MOE_STATIC_LINK_LIBS OpenMP::OpenMP_C DNNL::dnnl PkgConfig::OPENBLAS PkgConfig::JANSSON PkgConfig::ZLIB ${MOE_MATH_LIB})

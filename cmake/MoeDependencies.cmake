# Host-side dependencies of the engine, gathered in one INTERFACE target `moe_deps`.
find_package(PkgConfig REQUIRED)
# Debian's dlpack package reports a wrong version: ask without one.
find_package(dlpack CONFIG REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS C)
# CPU GEMMs: OpenBLAS (chosen by measurement, bench/RESULTS.md "CPU GEMM library").
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
find_library(MOE_MATH_LIB m)

add_library(moe_deps INTERFACE)
target_link_libraries(moe_deps INTERFACE dlpack::dlpack OpenMP::OpenMP_C PkgConfig::OPENBLAS ${MOE_MATH_LIB})
set(MOE_STATIC_LINK_LIBS OpenMP::OpenMP_C PkgConfig::OPENBLAS ${MOE_MATH_LIB})

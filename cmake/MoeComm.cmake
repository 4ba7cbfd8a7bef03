# Communicator back ends (src/comm/). Included after MoeDependencies (moe_deps) and MoeCuda
# (CUDAToolkit, MOE_NCCL_FOUND).
#
#   MOE_MPI  = AUTO | ON | OFF   MPI communicators (CPU ranks) and the mpirun tests (tests/mpi)
#   MOE_NCCL = AUTO | ON | OFF   NCCL communicators (declared in CMakeLists.txt, found by MoeCuda)
#
# Each back end found adds its libraries to moe_deps (so the object libraries compile with
# MOE_HAVE_MPI / MOE_HAVE_NCCL and the shared library links them) and to MOE_STATIC_LINK_LIBS (what
# users of the static archive need). moe_build_features() reports MOE_FEATURE_MPI / MOE_FEATURE_NCCL.
set(MOE_MPI "AUTO" CACHE STRING "Build MPI communicators: AUTO, ON or OFF")
set_property(CACHE MOE_MPI PROPERTY STRINGS AUTO ON OFF)
if(NOT MOE_MPI MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MOE_MPI must be AUTO, ON or OFF (got '${MOE_MPI}')")
endif()
if(NOT MOE_NCCL MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MOE_NCCL must be AUTO, ON or OFF (got '${MOE_NCCL}')")
endif()

# ---------------------------------------------------------------- MPI
set(MOE_HAVE_MPI OFF)
set(MOE_PC_REQUIRES_PRIVATE "")
set(MOE_PC_COMM_LIBS "")
if(NOT MOE_MPI STREQUAL "OFF")
  find_package(MPI QUIET COMPONENTS C)
  if(MPI_C_FOUND)
    set(MOE_HAVE_MPI ON)
    # MPI::MPI_C's include directories are imported, hence -isystem: MPI headers do not trip our warnings.
    target_link_libraries(moe_deps INTERFACE MPI::MPI_C)
    target_compile_definitions(moe_deps INTERFACE MOE_HAVE_MPI=1)
    list(APPEND MOE_STATIC_LINK_LIBS MPI::MPI_C)
    # pkg-config name of the MPI C library, for moe.pc's Requires.private (Open MPI and MPICH ship one)
    find_package(PkgConfig QUIET)
    foreach(pc ompi-c mpich mpi-c)
      pkg_check_modules(MOE_MPI_PC QUIET ${pc})
      if(MOE_MPI_PC_FOUND)
        set(MOE_PC_REQUIRES_PRIVATE "${pc}")
        break()
      endif()
    endforeach()
    # mpirun flags of the tests: Open MPI as root needs --allow-run-as-root; CI machines have fewer
    # cores than ranks (--oversubscribe); shared memory only, so missing network interfaces are moot.
    set(MOE_MPI_IS_OPENMPI OFF)
    if(MPIEXEC_EXECUTABLE)
      execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _moe_mpiexec_version
                      ERROR_QUIET RESULT_VARIABLE _moe_mpiexec_rc TIMEOUT 20)
      if(_moe_mpiexec_version MATCHES "Open MPI|OpenRTE")
        set(MOE_MPI_IS_OPENMPI ON)
      endif()
    endif()
    set(MOE_MPIEXEC_EXTRA_FLAGS "" CACHE STRING "Extra flags the MPI tests pass to mpiexec")
    if(MOE_MPI_IS_OPENMPI)
      set(MOE_MPIEXEC_FLAGS --oversubscribe --allow-run-as-root --mca btl self,vader ${MOE_MPIEXEC_EXTRA_FLAGS})
    else()
      set(MOE_MPIEXEC_FLAGS ${MOE_MPIEXEC_EXTRA_FLAGS})
    endif()
  elseif(MOE_MPI STREQUAL "ON")
    message(FATAL_ERROR "MOE_MPI=ON but no MPI C library was found (Debian: libopenmpi-dev openmpi-bin)")
  endif()
endif()

# ---------------------------------------------------------------- NCCL
# MoeCuda found the toolkit and, unless MOE_NCCL=OFF, nccl.h / libnccl beside it. Host C code calls
# the CUDA runtime API (cudart, never libcuda, so the library loads without a driver) and NCCL.
set(MOE_HAVE_NCCL OFF)
if(NOT MOE_NCCL STREQUAL "OFF")
  if(MOE_NCCL_FOUND AND TARGET CUDA::cudart)
    set(MOE_HAVE_NCCL ON)
    target_include_directories(moe_deps SYSTEM INTERFACE ${MOE_NCCL_INCLUDE})
    target_link_libraries(moe_deps INTERFACE CUDA::cudart ${MOE_NCCL_LIBRARY})
    target_compile_definitions(moe_deps INTERFACE MOE_HAVE_NCCL=1)
    list(APPEND MOE_STATIC_LINK_LIBS CUDA::cudart ${MOE_NCCL_LIBRARY})
    get_filename_component(_moe_nccl_dir "${MOE_NCCL_LIBRARY}" DIRECTORY)
    set(_moe_pc_dirs "${_moe_nccl_dir}" "${CUDAToolkit_LIBRARY_DIR}")
    list(REMOVE_DUPLICATES _moe_pc_dirs)
    list(TRANSFORM _moe_pc_dirs PREPEND "-L")
    list(JOIN _moe_pc_dirs " " _moe_pc_dirs)
    set(MOE_PC_COMM_LIBS "${_moe_pc_dirs} -lnccl -lcudart")
  elseif(MOE_NCCL STREQUAL "ON")
    message(FATAL_ERROR "MOE_NCCL=ON but NCCL or the CUDA toolkit was not found (MOE_CUDA=${MOE_CUDA}; NCCL is looked "
                        "for beside the toolkit, e.g. /usr/local/cuda)")
  endif()
endif()

# moe.pc is configured at install time (MoeInstall.cmake); this runs just before, in the same install
# script, so the variable is set when moe.pc.in is read.
install(CODE "
  set(MOE_PC_REQUIRES_PRIVATE \"${MOE_PC_REQUIRES_PRIVATE}\")
  set(MOE_PC_COMM_LIBS \"${MOE_PC_COMM_LIBS}\")
")

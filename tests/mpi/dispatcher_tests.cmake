# Standalone token dispatcher over EP == one rank (tests/mpi/test_dispatcher_ep.c), for 1, 2 and 4
# ranks (label "mpi"). Included by tests/mpi/CMakeLists.txt.
add_executable(test_dispatcher_ep ${CMAKE_CURRENT_LIST_DIR}/test_dispatcher_ep.c ${CMAKE_CURRENT_LIST_DIR}/rank_split.c)
# public ABI only: the shared library and its header
target_link_libraries(test_dispatcher_ep PRIVATE moe MPI::MPI_C m)
target_compile_definitions(test_dispatcher_ep PRIVATE _POSIX_C_SOURCE=200809L)
moe_set_warnings(test_dispatcher_ep)

set(MOE_DISPATCHER_MPIRUN ${MPIEXEC_EXECUTABLE} ${MOE_MPIEXEC_FLAGS} ${MPIEXEC_PREFLAGS})
foreach(np 1 2 4)
  add_test(NAME dispatcher_ep_np${np}
           COMMAND ${MOE_DISPATCHER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_dispatcher_ep>
                   ${MPIEXEC_POSTFLAGS})
  set_tests_properties(dispatcher_ep_np${np} PROPERTIES LABELS mpi TIMEOUT 120 PROCESSORS ${np}
                       PASS_REGULAR_EXPRESSION "[0-9]+ passed, 0 failed" FAIL_REGULAR_EXPRESSION "FAIL")
endforeach()

# Expert-parallel layer == single-rank layer (tests/mpi/test_layer_ep.c), for 1, 2 and 4 ranks
# (label "mpi"). Included by tests/mpi/CMakeLists.txt. The chunked cases (par.num_chunks = 2, 3, 50,
# chunks of local experts, 50 clamped to E_local; memcmp against the unchunked layer and checked by
# their all-to-all count, 1 + 4 min(C, E_local)) are separate entries so that they can be tracked on
# their own.
add_executable(test_layer_ep ${CMAKE_CURRENT_LIST_DIR}/test_layer_ep.c ${CMAKE_CURRENT_LIST_DIR}/rank_split.c)
# public ABI only: the shared library and its header (oneDNN only to ask which ISA it runs: the
# premise of the bitwise check, see probe_rows_independent)
target_link_libraries(test_layer_ep PRIVATE moe MPI::MPI_C DNNL::dnnl m)
target_compile_definitions(test_layer_ep PRIVATE _POSIX_C_SOURCE=200809L)
moe_set_warnings(test_layer_ep)

set(MOE_LAYER_MPIRUN ${MPIEXEC_EXECUTABLE} ${MOE_MPIEXEC_FLAGS} ${MPIEXEC_PREFLAGS})
foreach(np 1 2 4)
  add_test(NAME layer_ep_np${np}
           COMMAND ${MOE_LAYER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_layer_ep> ${MPIEXEC_POSTFLAGS})
  add_test(NAME layer_ep_chunked_np${np}
           COMMAND ${MOE_LAYER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_layer_ep> ${MPIEXEC_POSTFLAGS}
                   --chunked)
  set_tests_properties(layer_ep_np${np} layer_ep_chunked_np${np} PROPERTIES LABELS mpi TIMEOUT 120 PROCESSORS ${np}
                       PASS_REGULAR_EXPRESSION "[0-9]+ passed, 0 failed" FAIL_REGULAR_EXPRESSION "FAIL")
endforeach()

# Checkpoints across layouts (tests/mpi/test_checkpoint_ep.c): every saving layout onto every loading
# one, resumed runs bitwise, a missing rank file failing every rank, and a plain NumPy reader
# (tests/python/read_checkpoint.py, run by rank 0 with /usr/bin/python3) reassembling the files.
add_executable(test_checkpoint_ep ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_ep.c ${CMAKE_CURRENT_LIST_DIR}/rank_split.c)
target_link_libraries(test_checkpoint_ep PRIVATE moe MPI::MPI_C m)
target_compile_definitions(test_checkpoint_ep PRIVATE _POSIX_C_SOURCE=200809L)
moe_set_warnings(test_checkpoint_ep)
foreach(np 1 2 4)
  add_test(NAME checkpoint_ep_np${np}
           COMMAND ${MOE_LAYER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_checkpoint_ep> ${MPIEXEC_POSTFLAGS}
                   ${CMAKE_SOURCE_DIR}/tests/python/read_checkpoint.py)
  set_tests_properties(checkpoint_ep_np${np} PROPERTIES LABELS mpi TIMEOUT 120 PROCESSORS ${np}
                       PASS_REGULAR_EXPRESSION "[0-9]+ passed, 0 failed" FAIL_REGULAR_EXPRESSION "FAIL")
endforeach()

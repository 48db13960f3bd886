# Communication tests (issue 5): the MPI Communicator, the topology, the gradient reducer on
# 1, 2 and 4 ranks (and 4 ranks as 2 nodes x 2), and `kilter bench-comm --json` verifying its
# own results. Each binary has its own MPI-aware GoogleTest main (tests/mpi/comm_test_main.cpp).
if(TARGET GTest::gtest)
  foreach(comm_test comm_communicator_test comm_topology_test comm_reducer_test)
    add_executable(${comm_test} ${CMAKE_CURRENT_LIST_DIR}/${comm_test}.cpp ${CMAKE_CURRENT_LIST_DIR}/comm_test_main.cpp)
    target_link_libraries(${comm_test} PRIVATE kilter_lib GTest::gtest)
  endforeach()

  kilter_add_mpi_test(comm_communicator_np1 comm_communicator_test 1)
  kilter_add_mpi_test(comm_communicator_np3 comm_communicator_test 3)
  kilter_add_mpi_test(comm_communicator_np4 comm_communicator_test 4)
  kilter_add_mpi_test(comm_topology_np4 comm_topology_test 4)
  kilter_add_mpi_test(comm_reducer_np1 comm_reducer_test 1)
  kilter_add_mpi_test(comm_reducer_np2 comm_reducer_test 2)
  kilter_add_mpi_test(comm_reducer_np4 comm_reducer_test 4)
  kilter_add_mpi_test(comm_reducer_np4_2x2 comm_reducer_test 4 --ranks-per-node 2)
endif()

# bench-comm on 4 ranks as 2 nodes x 2: runs, verifies every result, prints well-formed JSON.
add_test(NAME comm_bench_json_np4_2x2
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/comm_bench_json.sh $<TARGET_FILE:kilter>)
set_tests_properties(comm_bench_json_np4_2x2 PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 4
                     ENVIRONMENT "MPIEXEC=${MPIEXEC_EXECUTABLE};KILTER_MPIRUN_FLAGS=${KILTER_MPIRUN_FLAGS_STR};KILTER_PYTHON=${KILTER_PYTHON};OPENBLAS_NUM_THREADS=1")

# Checkpointer, guards and watchdog across ranks.
add_executable(checkpoint_mpi_test ${CMAKE_CURRENT_LIST_DIR}/checkpoint_mpi_test.cpp)
target_link_libraries(checkpoint_mpi_test PRIVATE kilter_lib GTest::gtest)
kilter_add_mpi_test(checkpoint_mpi_2 checkpoint_mpi_test 2)
kilter_add_mpi_test(checkpoint_mpi_3 checkpoint_mpi_test 3)

# Expected to abort: passes when the watchdog's report names rank 1 as not arrived.
add_executable(checkpoint_watchdog_abort ${CMAKE_CURRENT_LIST_DIR}/checkpoint_watchdog_abort.cpp
               ${CMAKE_CURRENT_LIST_DIR}/comm_test_main.cpp)
target_link_libraries(checkpoint_watchdog_abort PRIVATE kilter_lib GTest::gtest)
kilter_add_mpi_test(checkpoint_watchdog_abort_3 checkpoint_watchdog_abort 3)
set_tests_properties(checkpoint_watchdog_abort_3 PROPERTIES TIMEOUT 120
  PASS_REGULAR_EXPRESSION "rank [02]: test barrier at step 2 has not completed after [0-9]+ s; ranks not arrived: 1 \\(working since 'test barrier' at step 1\\)")

# The one-GPU-per-rank check as a collective (issue 40): made-up records travel intact between 3
# ranks and every rank reaches the same verdict. Uses the comm tests' MPI-aware GoogleTest main.
if(TARGET GTest::gtest)
  add_executable(comm_device_sharing_test ${CMAKE_CURRENT_LIST_DIR}/comm_device_sharing_test.cpp
                 ${CMAKE_CURRENT_LIST_DIR}/comm_test_main.cpp)
  target_link_libraries(comm_device_sharing_test PRIVATE kilter_lib GTest::gtest)
  kilter_add_mpi_test(comm_device_sharing_np3 comm_device_sharing_test 3)
endif()

# lib/train/staging across the ranks of one node.
add_executable(io_staging_test ${CMAKE_CURRENT_LIST_DIR}/io_staging_test.cpp ${CMAKE_CURRENT_LIST_DIR}/comm_test_main.cpp)
target_link_libraries(io_staging_test PRIVATE kilter_lib GTest::gtest)
kilter_add_mpi_test(io_staging_mpi_2 io_staging_test 2)

# lib/train/staging across the ranks of one node (issue 3).
add_executable(io_staging_test ${CMAKE_CURRENT_LIST_DIR}/io_staging_test.cpp)
target_link_libraries(io_staging_test PRIVATE kilter_lib)
kilter_add_mpi_test(io_staging_mpi_2 io_staging_test 2)

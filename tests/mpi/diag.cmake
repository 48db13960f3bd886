# MPI test of RankDiagnostics: 4 ranks, a fake step loop in which one rank is slow in one phase.
add_executable(diag_rank_test ${CMAKE_CURRENT_LIST_DIR}/diag_rank_test.cpp)
target_link_libraries(diag_rank_test PRIVATE kilter_lib GTest::gtest)
kilter_add_mpi_test(diag_rank_4 diag_rank_test 4)

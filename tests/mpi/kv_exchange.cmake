# The K/V exchange of cut pieces (issue 23): lib/comm/kv_exchange_mpi.h driven by a fake backend
# on 2, 3 and 4 ranks (every prefix row delivered, every dK/dV summed at its owner; random steps) and its
# timeouts naming the rank that did not deliver.
if(TARGET GTest::gtest)
  add_executable(kv_exchange_test ${CMAKE_CURRENT_LIST_DIR}/kv_exchange_test.cpp ${CMAKE_CURRENT_LIST_DIR}/comm_test_main.cpp)
  target_link_libraries(kv_exchange_test PRIVATE kilter_lib GTest::gtest)
  kilter_add_mpi_test(kv_exchange_np2 kv_exchange_test 2)
  kilter_add_mpi_test(kv_exchange_np3 kv_exchange_test 3)
  kilter_add_mpi_test(kv_exchange_np4 kv_exchange_test 4)
endif()

# The exchange's benchmark program (bench/kv_exchange.sh runs it; it is not a test).
add_executable(kilter_bench_kv ${CMAKE_SOURCE_DIR}/bench/kv_exchange.cpp)
target_link_libraries(kilter_bench_kv PRIVATE kilter_lib)

# Unit tests of lib/comm that need no MPI run: the one-GPU-per-rank decision, the abort hooks, the
# chunk layout of sharded parameters and the pages that back them on a device.
kilter_add_unit_test(unit_comm_device_sharing ${CMAKE_CURRENT_LIST_DIR}/comm_device_sharing_test.cpp)
kilter_add_unit_test(unit_comm_abort_hooks ${CMAKE_CURRENT_LIST_DIR}/comm_abort_hooks_test.cpp)
kilter_add_unit_test(unit_comm_shard_chunks ${CMAKE_CURRENT_LIST_DIR}/comm_shard_chunks_test.cpp)
kilter_add_unit_test(unit_comm_unit_pages ${CMAKE_CURRENT_LIST_DIR}/comm_unit_pages_test.cpp)

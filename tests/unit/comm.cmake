# Unit tests of lib/comm that need no MPI run: the one-GPU-per-rank decision (issue 40).
kilter_add_unit_test(unit_comm_device_sharing ${CMAKE_CURRENT_LIST_DIR}/comm_device_sharing_test.cpp)
kilter_add_unit_test(unit_comm_abort_hooks ${CMAKE_CURRENT_LIST_DIR}/comm_abort_hooks_test.cpp)

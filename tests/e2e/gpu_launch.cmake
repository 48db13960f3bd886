# Several ranks on one GPU (issue 40), the parts a CPU can check: the launcher and the
# environment each rank gets, and the device's NCCL check rehearsed with train.backend=cpu (its
# references, matrix, drills and table). The GPU runs themselves: tests/gpu/nccl-check.sh.
kilter_add_e2e_test(e2e_ranks_on_one_gpu ${CMAKE_CURRENT_LIST_DIR}/ranks_on_one_gpu.sh)
kilter_add_e2e_test(e2e_nccl_check_cpu ${CMAKE_CURRENT_LIST_DIR}/nccl_check_cpu.sh)
set_tests_properties(e2e_ranks_on_one_gpu PROPERTIES PROCESSORS 4)
set_tests_properties(e2e_nccl_check_cpu PROPERTIES PROCESSORS 4)

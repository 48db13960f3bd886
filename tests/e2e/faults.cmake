# Plain messages for the faults users meet (issue 17): each fault of docs/reliability.md that the
# checkpoint tests (checkpoint.cmake) do not already cover. The mount-namespace tests (a small
# tmpfs as the full disk) exit 77, skipped with the reason, where unshare -m is not allowed.
kilter_add_e2e_test(e2e_fault_disk_full ${CMAKE_CURRENT_LIST_DIR}/fault_disk_full.sh)
set_tests_properties(e2e_fault_disk_full PROPERTIES SKIP_RETURN_CODE 77)
kilter_add_e2e_test(e2e_fault_nonfinite ${CMAKE_CURRENT_LIST_DIR}/fault_nonfinite.sh)
kilter_add_e2e_test(e2e_fault_run_dir ${CMAKE_CURRENT_LIST_DIR}/fault_run_dir.sh)
kilter_add_e2e_test(e2e_fault_shard_lost ${CMAKE_CURRENT_LIST_DIR}/fault_shard_lost.sh)
kilter_add_e2e_test(e2e_fault_stage_dir ${CMAKE_CURRENT_LIST_DIR}/fault_stage_dir.sh)
set_tests_properties(e2e_fault_stage_dir PROPERTIES SKIP_RETURN_CODE 77)

# The memory plan of each sharding mode (train.shard, train.shard_group, reshard_after_forward)
# and its advice, from `kilter plan` alone.
kilter_add_e2e_test(e2e_memory_plan_modes ${CMAKE_CURRENT_LIST_DIR}/memory_plan_modes.sh)
# The plan against each rank's measured peak RSS by mode, with the communication thread on.
kilter_add_e2e_test(e2e_memory_plan_rss ${CMAKE_CURRENT_LIST_DIR}/memory_plan_rss.sh)

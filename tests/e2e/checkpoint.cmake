# Checkpoints, resume, preemption and fault handling end to end (issue 8); the sharded optimizer (issue 24).
kilter_add_e2e_test(e2e_resume_equality ${CMAKE_CURRENT_LIST_DIR}/resume_equality.sh)
kilter_add_e2e_test(e2e_resume_world_size ${CMAKE_CURRENT_LIST_DIR}/resume_world_size.sh)
kilter_add_e2e_test(e2e_resume_torch ${CMAKE_CURRENT_LIST_DIR}/resume_torch.sh)
kilter_add_e2e_test(e2e_fault_signal ${CMAKE_CURRENT_LIST_DIR}/fault_signal.sh)
kilter_add_e2e_test(e2e_fault_kill_write ${CMAKE_CURRENT_LIST_DIR}/fault_kill_write.sh)
kilter_add_e2e_test(e2e_fault_bad_checkpoint ${CMAKE_CURRENT_LIST_DIR}/fault_bad_checkpoint.sh)
kilter_add_e2e_test(e2e_fault_config_mismatch ${CMAKE_CURRENT_LIST_DIR}/fault_config_mismatch.sh)
kilter_add_e2e_test(e2e_fault_rank_error ${CMAKE_CURRENT_LIST_DIR}/fault_rank_error.sh)
kilter_add_e2e_test(e2e_shard_optimizer ${CMAKE_CURRENT_LIST_DIR}/shard_optimizer.sh)
# Sharding inside the node, replicating across nodes (HSDP: train.shard_group = node).
kilter_add_e2e_test(e2e_shard_group ${CMAKE_CURRENT_LIST_DIR}/shard_group.sh)
# Fully sharded parameters (ZeRO-3: train.shard = parameters).
kilter_add_e2e_test(e2e_shard_parameters ${CMAKE_CURRENT_LIST_DIR}/shard_parameters.sh)
# The distributed optimizer (train.shard = optimizer under bf16 storage: the fp32 master sharded).
kilter_add_e2e_test(e2e_distributed_optimizer ${CMAKE_CURRENT_LIST_DIR}/distributed_optimizer.sh)
# ... with pieces cut between ranks (context parallelism) and training samples.
kilter_add_e2e_test(e2e_shard_parameters_cut ${CMAKE_CURRENT_LIST_DIR}/shard_parameters_cut.sh)
kilter_add_e2e_test(e2e_memory_plan ${CMAKE_CURRENT_LIST_DIR}/memory_plan.sh)
# A checkpoint from before the architecture keys (issue 38; the file is kept in
# tests/e2e/fixtures/gpt2-before-arch) resumes as gpt2, bit-identical to a straight run.
kilter_add_e2e_test(e2e_resume_old_checkpoint ${CMAKE_CURRENT_LIST_DIR}/resume_old_checkpoint.sh)

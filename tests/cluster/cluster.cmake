# Multi-node tests on a cluster of network namespaces on this machine (issue 15, label `cluster`):
# each test stands up its own scripts/vcluster (2 nodes: own hostname, network and node-local
# directory) and tears it down on every exit, checking that nothing is left. They need root and
# namespaces (CI runs as root) and exit 77 (skipped, with the reason) without them; one at a time
# (one cluster per machine).
#   cluster_train:     2 nodes x 2: topology from the real hosts (comm_topology_test across nodes,
#                      num_nodes 2), hierarchical == flat == 1 rank (losses 1e-5, weights)
#   cluster_hsdp:      2 nodes x 2: train.shard = parameters and optimizer with shard_group = node
#                      (HSDP) == 1 rank (losses 1e-6 and 1e-5, weights); summary.json says the sharding
#   cluster_staging:   data.stage_dir on the node-local path: one verified copy per node, reused
#                      by the next job, a damaged copy replaced on its node only
#   cluster_node_loss: node2's link down / its ranks killed mid-run: the job ends, non-zero,
#                      naming node2's ranks
#   cluster_multinode_slurm: sbatch --nodes=2 from node2; USR1 -> checkpoint, requeue, resume on both nodes
#   cluster_teardown:  vcluster down after a failing test, a killed test, a killed `up`, lost state
set(KILTER_CLUSTER_ENV "KILTER_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILTER_PYTHON=${KILTER_PYTHON};OPENBLAS_NUM_THREADS=1")
set(KILTER_CLUSTER_TOPOLOGY_TEST "")
if(TARGET GTest::gtest)   # tests/mpi/comm.cmake builds it (included after this fragment)
  set(KILTER_CLUSTER_TOPOLOGY_TEST $<TARGET_FILE:comm_topology_test>)
endif()
foreach(cluster_test train hsdp staging node_loss slurm teardown)
  set(name cluster_${cluster_test})
  if(cluster_test STREQUAL "slurm")
    set(name cluster_multinode_slurm)   # cluster_slurm is the single-node e2e test (tests/e2e)
  endif()
  set(extra_args "")
  if(cluster_test STREQUAL "train")
    set(extra_args ${KILTER_CLUSTER_TOPOLOGY_TEST})
  endif()
  add_test(NAME ${name} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/${cluster_test}.sh $<TARGET_FILE:kilter> ${extra_args})
  set_tests_properties(${name} PROPERTIES LABELS cluster TIMEOUT 300 SKIP_RETURN_CODE 77 PROCESSORS 2
                       RESOURCE_LOCK kilter_vcluster ENVIRONMENT "${KILTER_CLUSTER_ENV}")
endforeach()

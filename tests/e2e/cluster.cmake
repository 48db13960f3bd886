# Cluster integration end to end (issue 9). Both need system tools that CI
# installs with scripts/install-deps.sh --with-test-extras and exit 77 (skipped, with the reason)
# where they are missing.
#   cluster_lmod:  cmake --install to a temporary prefix, `module load kilter` under Lmod (Lua and
#                  Tcl modulefiles, prerequisites), `kilter --version`.
#   cluster_slurm: a real single-node Slurm (munged, slurmctld, slurmd started by the test):
#                  sbatch slurm/train.sbatch runs to completion; a job sent USR1 checkpoints,
#                  requeues itself and finishes from its checkpoint.
kilter_add_e2e_test(cluster_lmod ${CMAKE_CURRENT_LIST_DIR}/lmod.sh)
set_tests_properties(cluster_lmod PROPERTIES SKIP_RETURN_CODE 77)
kilter_add_e2e_test(cluster_slurm ${CMAKE_CURRENT_LIST_DIR}/slurm.sh)
# Its jobs use both cores of a CI machine; two copies at once would only slow each other down.
set_tests_properties(cluster_slurm PROPERTIES SKIP_RETURN_CODE 77 PROCESSORS 2 RESOURCE_LOCK kilter_slurm_cluster)

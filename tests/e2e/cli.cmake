# The command line as users live with it (issue 25).
#   e2e_cli_errors: every mistake of the issue (guessed options, unknown keys and commands, checks
#                   before MPI, messages with internals) gives its message and exit code.
#   e2e_rerun:      an interrupted run re-run with the same command continues with its metrics
#                   intact; another config is refused (exit 2); --force keeps the old run.
#   e2e_sbatch_ini: slurm/train.sbatch's INI reader against kilter's on every inputs/*.ini.
#   e2e_no_outside_docs: no doc or comment sends readers to a design file outside the repository.
kilter_add_e2e_test(e2e_cli_errors ${CMAKE_CURRENT_LIST_DIR}/cli_errors.sh)
kilter_add_e2e_test(e2e_rerun ${CMAKE_CURRENT_LIST_DIR}/rerun.sh)
set_tests_properties(e2e_rerun PROPERTIES PROCESSORS 2)
kilter_add_e2e_test(e2e_sbatch_ini ${CMAKE_CURRENT_LIST_DIR}/sbatch_ini.sh)
kilter_add_e2e_test(e2e_no_outside_docs ${CMAKE_CURRENT_LIST_DIR}/no_outside_docs.sh)
#   e2e_report_compare: kilter report --compare on two runs, rendered in headless Chromium (skips
#                   with exit 77 where chromium is absent).
kilter_add_e2e_test(e2e_report_compare ${CMAKE_CURRENT_LIST_DIR}/report_compare.sh)
set_tests_properties(e2e_report_compare PROPERTIES PROCESSORS 2 SKIP_RETURN_CODE 77)

# End-to-end training tests (the lead's): world-size invariance, determinism, flat == hierarchical.
kilter_add_e2e_test(e2e_invariance ${CMAKE_CURRENT_LIST_DIR}/invariance.sh)
kilter_add_e2e_test(e2e_plan_cli ${CMAKE_CURRENT_LIST_DIR}/plan_cli.sh)

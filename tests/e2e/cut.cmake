# Training with pieces cut between ranks (issue 23), end to end: world-size invariance,
# determinism, resume onto another world size and bf16 with cuts; long contexts over several
# ranks; a rank that dies or hangs inside the K/V exchange ends the job, named; the cut-cost
# check re-plans a run whose cuts cost more than charged.
kilter_add_e2e_test(e2e_cut_invariance ${CMAKE_CURRENT_LIST_DIR}/cut_invariance.sh)
kilter_add_e2e_test(e2e_cut_long_context ${CMAKE_CURRENT_LIST_DIR}/cut_long_context.sh)
kilter_add_e2e_test(e2e_fault_kv_exchange ${CMAKE_CURRENT_LIST_DIR}/fault_kv_exchange.sh)
kilter_add_e2e_test(e2e_cut_cost_check ${CMAKE_CURRENT_LIST_DIR}/cut_cost_check.sh)

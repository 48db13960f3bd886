# Diagnostics end to end (issue 6).
#   diag_report:    kilter report on 4-rank runs written by diag_rank_test, rendered in headless Chromium.
#   diag_straggler: kilter train on 4 ranks with --train.inject_delay=2:0.05 names rank 2 / forward;
#                   without the drill nobody is named.
kilter_add_e2e_test(diag_report ${CMAKE_CURRENT_LIST_DIR}/report.sh)
set_tests_properties(diag_report PROPERTIES PROCESSORS 2)
kilter_add_e2e_test(diag_straggler ${CMAKE_CURRENT_LIST_DIR}/straggler.sh)
set_tests_properties(diag_straggler PROPERTIES PROCESSORS 2)

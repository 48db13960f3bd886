# Diagnostics end to end (issue 6).
#   diag_report:    kilter report on 4-rank runs written by diag_rank_test, rendered in headless Chromium.
#   diag_straggler: kilter train on 4 ranks with --train.inject_delay=2:0.05 names rank 2 / forward;
#                   without the drill nobody is named.
kilter_add_e2e_test(diag_report ${CMAKE_CURRENT_LIST_DIR}/report.sh)
set_tests_properties(diag_report PROPERTIES PROCESSORS 2)
kilter_add_e2e_test(diag_straggler ${CMAKE_CURRENT_LIST_DIR}/straggler.sh)
set_tests_properties(diag_straggler PROPERTIES PROCESSORS 2)
# TensorBoard event files of a 2-rank run and of the same run resumed, read back by TensorBoard's
# reader (the python of the Parquet build's venv, which install-deps.sh gives `tensorboard` with
# --with-test-extras; KILTER_PYARROW_PYTHON, cmake/KilterParquet.cmake). Exit 77: not installed.
kilter_add_e2e_test(diag_tensorboard ${CMAKE_CURRENT_LIST_DIR}/tensorboard.sh)
set_tests_properties(diag_tensorboard PROPERTIES PROCESSORS 2 SKIP_RETURN_CODE 77)
if(KILTER_PYARROW_PYTHON)
  set_property(TEST diag_tensorboard APPEND PROPERTY ENVIRONMENT "KILTER_PYARROW_PYTHON=${KILTER_PYARROW_PYTHON}")
endif()

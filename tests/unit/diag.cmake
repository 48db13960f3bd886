# Unit tests of the diagnostics statistics, live straggler watch, metrics CSV and trace files.
kilter_add_unit_test(diag_statistics_test ${CMAKE_CURRENT_LIST_DIR}/diag_statistics_test.cpp)
kilter_add_unit_test(diag_tensorboard_test ${CMAKE_CURRENT_LIST_DIR}/diag_tensorboard_test.cpp)

# The command line and its errors (issue 25): exact option names, did-you-mean, user vs internal
# errors, round-trip defaults, train.csv rows.
kilter_add_unit_test(unit_cli ${CMAKE_CURRENT_LIST_DIR}/cli_test.cpp)

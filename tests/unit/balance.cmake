# lib/balance tests (issue 4): the batch plan, the cost-balanced assignment, the cost-model fit.
kilter_add_unit_test(balance_plan_test ${CMAKE_CURRENT_LIST_DIR}/balance_plan_test.cpp)
kilter_add_unit_test(balance_assign_test ${CMAKE_CURRENT_LIST_DIR}/balance_assign_test.cpp)
kilter_add_unit_test(balance_calibrate_test ${CMAKE_CURRENT_LIST_DIR}/balance_calibrate_test.cpp)

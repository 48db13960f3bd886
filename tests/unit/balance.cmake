# lib/balance tests (issues 4 and 13): the batch plan, the division of a step among ranks, the
# cost-model fit, the in-run calibration's fit and the division by rank speed.
kilter_add_unit_test(balance_plan_test ${CMAKE_CURRENT_LIST_DIR}/balance_plan_test.cpp)
kilter_add_unit_test(balance_divide_test ${CMAKE_CURRENT_LIST_DIR}/balance_divide_test.cpp)
kilter_add_unit_test(balance_calibrate_test ${CMAKE_CURRENT_LIST_DIR}/balance_calibrate_test.cpp)
kilter_add_unit_test(balance_plan_steps_test ${CMAKE_CURRENT_LIST_DIR}/balance_plan_steps_test.cpp)
kilter_add_unit_test(balance_cut_test ${CMAKE_CURRENT_LIST_DIR}/balance_cut_test.cpp)
kilter_add_unit_test(balance_window_fit_test ${CMAKE_CURRENT_LIST_DIR}/balance_window_fit_test.cpp)
# What an in-run re-plan costs (bench/replan_cost.sh; never run as a test).
add_executable(kilter_bench_replan ${CMAKE_SOURCE_DIR}/bench/replan_cost.cpp)
target_link_libraries(kilter_bench_replan PRIVATE kilter_lib)
kilter_add_unit_test(balance_group_slots_test ${CMAKE_CURRENT_LIST_DIR}/balance_group_slots_test.cpp)

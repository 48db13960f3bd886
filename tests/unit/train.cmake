# Unit tests of the training loop's arithmetic (the lead's).
kilter_add_unit_test(unit_train_accumulation ${CMAKE_CURRENT_LIST_DIR}/train_accumulation.cpp)
kilter_add_unit_test(unit_train_micro_batch ${CMAKE_CURRENT_LIST_DIR}/train_micro_batch_test.cpp)
kilter_add_unit_test(unit_train_cut_schedule ${CMAKE_CURRENT_LIST_DIR}/train_cut_schedule_test.cpp)
kilter_add_unit_test(unit_train_plan_cache ${CMAKE_CURRENT_LIST_DIR}/train_plan_cache_test.cpp)
kilter_add_unit_test(unit_train_cost_calibration ${CMAKE_CURRENT_LIST_DIR}/train_cost_calibration_test.cpp)

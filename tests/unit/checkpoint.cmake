# Checkpoint file format, guards and signals (issue 8): single-process unit tests.
# The file-format test needs only kilter_io (io/ never depends on lib/), so it links just that.
add_executable(checkpoint_file_test ${CMAKE_CURRENT_LIST_DIR}/checkpoint_file_test.cpp)
target_link_libraries(checkpoint_file_test PRIVATE kilter_io GTest::gtest GTest::gtest_main)
add_test(NAME checkpoint_file_test COMMAND checkpoint_file_test)
set_tests_properties(checkpoint_file_test PROPERTIES LABELS unit TIMEOUT 300)

kilter_add_unit_test(checkpoint_guards_test ${CMAKE_CURRENT_LIST_DIR}/checkpoint_guards_test.cpp)

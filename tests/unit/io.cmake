# io/ tests (issue 3): dataset format and bad inputs, prep corpora, the prefetching reader,
# node-local staging's copy-and-verify.
kilter_add_unit_test(io_format_test ${CMAKE_CURRENT_LIST_DIR}/io_format_test.cpp)
kilter_add_unit_test(io_prep_test ${CMAKE_CURRENT_LIST_DIR}/io_prep_test.cpp)
kilter_add_unit_test(io_reader_test ${CMAKE_CURRENT_LIST_DIR}/io_reader_test.cpp)
kilter_add_unit_test(io_stage_test ${CMAKE_CURRENT_LIST_DIR}/io_stage_test.cpp)

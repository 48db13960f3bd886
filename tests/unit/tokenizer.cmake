# Tokenizers (issue 14): unit tests of the tokenizer kinds, and the tool the exact-match e2e
# tests run (tests/e2e/tokenizer.cmake).
kilter_add_unit_test(io_tokenizer_test ${CMAKE_CURRENT_LIST_DIR}/io_tokenizer_test.cpp)
add_executable(tokenizer_tool ${CMAKE_CURRENT_LIST_DIR}/tokenizer_tool.cpp)
target_link_libraries(tokenizer_tool PRIVATE kilter_io)

# The tokenizer benchmark's program (bench/tokenize.sh runs it; it is not a test).
add_executable(tokenize_bench ${CMAKE_SOURCE_DIR}/bench/tokenize_bench.cpp)
target_link_libraries(tokenize_bench PRIVATE kilter_io)

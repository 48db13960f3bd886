# `kilter prep` end to end (issue 3): the fortune demo corpus read back by h5py and h5dump, and
# the CLI's handling of bad input.
kilter_add_e2e_test(prep_fortune ${CMAKE_CURRENT_LIST_DIR}/prep_fortune.sh)
kilter_add_e2e_test(prep_errors ${CMAKE_CURRENT_LIST_DIR}/prep_errors.sh)

# The reader benchmark's program (bench/read.sh runs it; it is not a test).
add_executable(io_read_bench ${CMAKE_SOURCE_DIR}/bench/read_bench.cpp)
target_link_libraries(io_read_bench PRIVATE kilter_io)
# Shipped corpora (issue 26): .gz and .zst input, --text-key, --max-bad-lines.
kilter_add_e2e_test(prep_compressed ${CMAKE_CURRENT_LIST_DIR}/prep_compressed.sh)

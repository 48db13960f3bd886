# `kilter prep` end to end (issue 3): the fortune demo corpus read back by h5py and h5dump, and
# the CLI's handling of bad input.
kilter_add_e2e_test(prep_fortune ${CMAKE_CURRENT_LIST_DIR}/prep_fortune.sh)
kilter_add_e2e_test(prep_errors ${CMAKE_CURRENT_LIST_DIR}/prep_errors.sh)

# The reader benchmark's program (bench/read.sh runs it; it is not a test).
add_executable(io_read_bench ${CMAKE_SOURCE_DIR}/bench/read_bench.cpp)
target_link_libraries(io_read_bench PRIVATE kilter_io)
# Shipped corpora (issue 26): .gz and .zst input, --text-key, --max-bad-lines.
kilter_add_e2e_test(prep_compressed ${CMAKE_CURRENT_LIST_DIR}/prep_compressed.sh)
# Parquet input (cmake/KilterParquet.cmake): the same texts as Parquet and as JSONL give the same
# dataset; worker counts agree; damaged files and a wrong column give one error each. Exit 77
# where the build has no Parquet reader or no python has pyarrow (KILTER_PYARROW_PYTHON).
kilter_add_e2e_test(prep_parquet ${CMAKE_CURRENT_LIST_DIR}/prep_parquet.sh)
set_tests_properties(prep_parquet PROPERTIES PROCESSORS 2 SKIP_RETURN_CODE 77)
if(KILTER_PYARROW_PYTHON)
  set_property(TEST prep_parquet APPEND PROPERTY ENVIRONMENT "KILTER_PYARROW_PYTHON=${KILTER_PYARROW_PYTHON}")
endif()

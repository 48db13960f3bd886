# The GPU op table's CPU part (tests/gpu/op_table.h), in every build: its completeness against the
# CUDA kernels' declarations under lib/ (parsed, so no CUDA is needed), and the bf16 twins its
# rows hold the kernels to against the fp32 ops. The device part is tests/gpu/gpu.cmake's
# gpu_op_table (label gpu).
kilter_add_unit_test(op_table_cpu_test ${CMAKE_CURRENT_LIST_DIR}/op_table_coverage_test.cpp
                     ${CMAKE_CURRENT_LIST_DIR}/op_table_twins_test.cpp
                     ${CMAKE_SOURCE_DIR}/tests/gpu/op_table_cases.cpp)
target_compile_definitions(op_table_cpu_test PRIVATE KILTER_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
target_include_directories(op_table_cpu_test PRIVATE ${CMAKE_SOURCE_DIR})

# PyTorch parity of the CPU model (issue 2). The dump tool writes kilter's weights, batch, loss
# and gradients; the script checks them against torch (Debian python3-torch) within 1e-4.
add_executable(kilter_model_dump ${CMAKE_SOURCE_DIR}/tests/unit/model_dump_tool.cpp)
target_link_libraries(kilter_model_dump PRIVATE kilter_lib nlohmann_json::nlohmann_json)
add_test(NAME model_torch_parity
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/torch_parity.sh $<TARGET_FILE:kilter_model_dump>)
set_tests_properties(model_torch_parity PROPERTIES LABELS e2e TIMEOUT 600
                     ENVIRONMENT "KILTER_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILTER_PYTHON=${KILTER_PYTHON};OPENBLAS_NUM_THREADS=1")

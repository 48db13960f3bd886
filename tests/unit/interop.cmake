# Models and data in and out (issue 26): the safetensors reader/writer and the HF directory, the
# compressed corpus streams, the mixture draw (unit), and the tool the HF export/import e2e tests
# (tests/e2e/interop.cmake) run for kilter's side.
kilter_add_unit_test(io_safetensors_test ${CMAKE_CURRENT_LIST_DIR}/io_safetensors_test.cpp)
# The Llama family in and out (issue 38): the HF directory kilter writes and reads, and the
# refusals of init_from, without transformers.
kilter_add_unit_test(hf_llama_test ${CMAKE_CURRENT_LIST_DIR}/hf_llama_test.cpp)
add_executable(kilter_hf_tool ${CMAKE_CURRENT_LIST_DIR}/hf_tool.cpp)
target_link_libraries(kilter_hf_tool PRIVATE kilter_lib)
kilter_add_unit_test(io_compressed_test ${CMAKE_CURRENT_LIST_DIR}/io_compressed_test.cpp)
kilter_add_unit_test(balance_mixture_test ${CMAKE_CURRENT_LIST_DIR}/balance_mixture_test.cpp)
# The model's settings table reaches the config, the checkpoint and the HF config.json.
kilter_add_unit_test(model_settings_test ${CMAKE_CURRENT_LIST_DIR}/model_settings_test.cpp)

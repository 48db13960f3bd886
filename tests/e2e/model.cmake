# PyTorch parity of the CPU model (issue 2). The dump tool writes kilter's weights, batch, loss
# and gradients; the script checks them against torch (Debian python3-torch) within 1e-4.
add_executable(kilter_model_dump ${CMAKE_SOURCE_DIR}/tests/unit/model_dump_tool.cpp)
target_link_libraries(kilter_model_dump PRIVATE kilter_lib nlohmann_json::nlohmann_json)
add_test(NAME model_torch_parity
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/torch_parity.sh $<TARGET_FILE:kilter_model_dump>)
# The same with kilter's side computing two of the pieces cut between 3 ranks (issue 23).
add_test(NAME model_torch_parity_cut
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/torch_parity.sh $<TARGET_FILE:kilter_model_dump> --cut)
set_tests_properties(model_torch_parity model_torch_parity_cut PROPERTIES LABELS e2e TIMEOUT 600
                     ENVIRONMENT "KILTER_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILTER_PYTHON=${KILTER_PYTHON};OPENBLAS_NUM_THREADS=1")

# bf16 on the CPU backend (issue 16): a fortunes training run in bf16 tracks fp32 (2%) and is
# deterministic. Skipped (77) on CPUs without bf16 instructions.
kilter_add_e2e_test(e2e_bf16_fortunes ${CMAKE_CURRENT_LIST_DIR}/bf16_fortunes.sh)
set_tests_properties(e2e_bf16_fortunes PROPERTIES SKIP_RETURN_CODE 77)

# Activation recomputation (issue 24): 2-rank runs with each train.recompute mode bit-identical
# to none (losses, weights, moments), with cut pieces, and in bf16 where the CPU has it.
kilter_add_e2e_test(e2e_recompute ${CMAKE_CURRENT_LIST_DIR}/recompute.sh)

# model.arch = llama end to end (issue 38): determinism, world-size invariance (flat, 2 x 2,
# sharded or not), cut pieces and a context longer than a micro-batch against 1 rank, bf16 with
# recompute, and a resume onto another world size.
kilter_add_e2e_test(e2e_llama_train ${CMAKE_CURRENT_LIST_DIR}/llama_train.sh)

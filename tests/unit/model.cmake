# Model, optimizer and CPU backend tests (issue 2), plus the CPU step benchmark executable
# (a build target only; bench/cpu_step.sh runs it next to PyTorch).
kilter_add_unit_test(model_ops_test ${CMAKE_CURRENT_LIST_DIR}/model_ops_test.cpp)
kilter_add_unit_test(model_gradcheck_test ${CMAKE_CURRENT_LIST_DIR}/model_gradcheck_test.cpp)
kilter_add_unit_test(model_optim_test ${CMAKE_CURRENT_LIST_DIR}/model_optim_test.cpp)
kilter_add_unit_test(model_attention_groups_test ${CMAKE_CURRENT_LIST_DIR}/model_attention_groups_test.cpp)
kilter_add_unit_test(model_bf16_test ${CMAKE_CURRENT_LIST_DIR}/model_bf16_test.cpp)
# Cut pieces (issue 23): models in threads joined by tests/unit/thread_kv_exchange.h (label tsan).
kilter_add_unit_test(model_cut_test ${CMAKE_CURRENT_LIST_DIR}/model_cut_test.cpp)
# The Llama family (issue 38): RMSNorm, RoPE, SwiGLU and grouped-query attention on the CPU.
kilter_add_unit_test(model_llama_test ${CMAKE_CURRENT_LIST_DIR}/model_llama_test.cpp)

add_executable(kilter_bench_step ${CMAKE_SOURCE_DIR}/bench/cpu_step.cpp)
target_link_libraries(kilter_bench_step PRIVATE kilter_lib)

# train.recompute (issue 24): every mode bit-identical to none, whole and cut pieces.
kilter_add_unit_test(model_recompute_test ${CMAKE_CURRENT_LIST_DIR}/model_recompute_test.cpp)

# The CUDA backend's host side (no device needed): cuBLASLt loaded on first use, not linked.
# Built only with CUDA, which the sanitizer builds leave out, so CI runs it in the normal build
# (KILTER_NO_ASAN_TESTS).
if(KILTER_WITH_CUDA)
  kilter_add_unit_test(backend_cuda_host_test ${CMAKE_CURRENT_LIST_DIR}/backend_cuda_host_test.cpp)
endif()

# The CPU oracle of the CUDA backend's bf16 storage (issue 37): its twins, determinism, recompute,
# cut pieces and the distance to fp32.
kilter_add_unit_test(model_bf16_storage_test ${CMAKE_CURRENT_LIST_DIR}/model_bf16_storage_test.cpp)

# The attention self-checks' inputs see a mask off by one key (whole pieces, later parts of cut
# pieces: bottom-right alignment): the CPU packed attention against shifted copies of itself.
kilter_add_unit_test(model_attention_self_check_test ${CMAKE_CURRENT_LIST_DIR}/model_attention_self_check_test.cpp)

# The block schedule on a recording op table: the steps and the K/V exchange's calls in order.
kilter_add_unit_test(model_block_schedule_test ${CMAKE_CURRENT_LIST_DIR}/model_block_schedule_test.cpp)

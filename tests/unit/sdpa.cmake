# The cuDNN SDPA attention engine (issue 37) without a device: its host-side plans (offsets,
# buckets, staging map) against the CPU packed attention, and, where the engine is built, its
# cudnn-frontend graphs for whole and cut pieces validated for sm_90. The graph test is built only
# with the frontend (CUDA, which the sanitizer builds leave out): the no_asan label runs it in CI's
# normal build.
kilter_add_unit_test(model_sdpa_plan_test ${CMAKE_CURRENT_LIST_DIR}/model_sdpa_plan_test.cpp)
if(KILTER_WITH_SDPA)
  kilter_add_unit_test(backend_sdpa_graph_test ${CMAKE_CURRENT_LIST_DIR}/backend_sdpa_graph_test.cpp)
  set_property(TEST backend_sdpa_graph_test APPEND PROPERTY LABELS no_asan)
endif()

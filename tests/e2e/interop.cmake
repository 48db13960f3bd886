# Models in and out (issue 26): `kilter export --format hf` and `train.init_from` against
# Hugging Face transformers, which lives in a test-only venv (scripts/install-deps.sh
# --with-test-extras makes it; it sees Debian's torch).
set(KILTER_HF_PYTHON /opt/kilter-test-venv/bin/python CACHE FILEPATH "Python with transformers + safetensors (HF interop tests)")
foreach(name hf_export hf_import)
  add_test(NAME e2e_${name} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/${name}.sh $<TARGET_FILE:kilter> $<TARGET_FILE:kilter_hf_tool>)
  set_tests_properties(e2e_${name} PROPERTIES LABELS e2e TIMEOUT 600
                       ENVIRONMENT "KILTER_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILTER_PYTHON=${KILTER_PYTHON};KILTER_HF_PYTHON=${KILTER_HF_PYTHON};MPIEXEC=${MPIEXEC_EXECUTABLE};KILTER_MPIRUN_FLAGS=${KILTER_MPIRUN_FLAGS_STR};OPENBLAS_NUM_THREADS=1")
endforeach()
# The Llama family (issue 38): export of llama checkpoints and train.init_from of Llama, Qwen2 and
# Mistral directories against transformers; skipped (77) where the venv is missing.
foreach(name hf_llama_export hf_llama_import)
  add_test(NAME e2e_${name} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/${name}.sh $<TARGET_FILE:kilter> $<TARGET_FILE:kilter_hf_tool>)
  set_tests_properties(e2e_${name} PROPERTIES LABELS e2e TIMEOUT 600 SKIP_RETURN_CODE 77
                       ENVIRONMENT "KILTER_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILTER_PYTHON=${KILTER_PYTHON};KILTER_HF_PYTHON=${KILTER_HF_PYTHON};MPIEXEC=${MPIEXEC_EXECUTABLE};KILTER_MPIRUN_FLAGS=${KILTER_MPIRUN_FLAGS_STR};OPENBLAS_NUM_THREADS=1")
endforeach()
# Parity of the CPU llama model with transformers' LlamaForCausalLM / Qwen2ForCausalLM: logits,
# loss and every gradient (kilter_model_dump --llama, tests/python/hf_llama_parity.py).
add_test(NAME model_llama_parity COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/llama_parity.sh $<TARGET_FILE:kilter_model_dump>)
set_tests_properties(model_llama_parity PROPERTIES LABELS e2e TIMEOUT 600 SKIP_RETURN_CODE 77
                     ENVIRONMENT "KILTER_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILTER_HF_PYTHON=${KILTER_HF_PYTHON};OPENBLAS_NUM_THREADS=1")
# Weighted mixtures of datasets (data.sources): shares, wraps, world-size invariance, resume.
kilter_add_e2e_test(e2e_mixture ${CMAKE_CURRENT_LIST_DIR}/mixture.sh)

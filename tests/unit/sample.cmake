# Issue 14: KV-cache generation, the token picker, sampling's text codec and the tokenizer that
# checkpoints record.
kilter_add_unit_test(sample_generate_test ${CMAKE_CURRENT_LIST_DIR}/sample_generate_test.cpp)

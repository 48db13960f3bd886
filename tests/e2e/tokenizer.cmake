# Tokenizers (issue 14): kilter's ids equal the reference libraries' for every document of a
# corpus the tokenizers were not trained on (HF `tokenizers` byte-level BPE; SentencePiece BPE
# and unigram), through tokenizer_tool and through `kilter prep`. Exit 77 (skipped) only when the
# oracle Python package is missing.
foreach(kind hf hf-split hf-extras sp-bpe sp-unigram)
  add_test(NAME tokenizer_exact_${kind}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/tokenizer_exact.sh $<TARGET_FILE:kilter> ${kind}
                   $<TARGET_FILE:tokenizer_tool>)
  set_tests_properties(tokenizer_exact_${kind} PROPERTIES LABELS e2e TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "KILTER_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILTER_PYTHON=${KILTER_PYTHON}")
endforeach()
kilter_add_e2e_test(tokenizer_prep ${CMAKE_CURRENT_LIST_DIR}/tokenizer_prep.sh)
set_tests_properties(tokenizer_prep PROPERTIES SKIP_RETURN_CODE 77)

# Issue 14: imports of tokenized corpora, `kilter sample` (greedy equals a PyTorch reference token
# for token, sampling options, stops, errors) and training's periodic samples.
kilter_add_e2e_test(import_formats ${CMAKE_CURRENT_LIST_DIR}/import_formats.sh)
kilter_add_e2e_test(sample_cli ${CMAKE_CURRENT_LIST_DIR}/sample_cli.sh)

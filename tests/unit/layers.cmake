# The layers of docs/design.md held (its Layout table's "may use" column): an include that goes the
# wrong way, or lib folders that include each other in a cycle, fail (scripts/check_layers.py,
# which first checks itself on a made-up back-include).
add_test(NAME layers_check COMMAND ${KILTER_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/check_layers.py ${CMAKE_SOURCE_DIR})
set_tests_properties(layers_check PROPERTIES LABELS unit TIMEOUT 60)

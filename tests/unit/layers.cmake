# The layers of docs/design.md held (its Layout table's "may use" column): an include that goes the
# wrong way, or lib folders that include each other in a cycle, fail (scripts/check_layers.py,
# which first checks itself on a made-up back-include).
add_test(NAME layers_check COMMAND ${KILTER_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/check_layers.py ${CMAKE_SOURCE_DIR})
set_tests_properties(layers_check PROPERTIES LABELS unit TIMEOUT 60)

# Comments name the concept ("context parallelism", "the sharded optimizer"), never a tracker
# number: a reader of the code cannot look one up. Fails listing each "issue N" in lib, io, app.
add_test(NAME source_names_concepts
         COMMAND sh -c "if grep -rniE 'issue [0-9]' lib io app; then echo 'source_names_concepts: FAIL: name the concept instead of the tracker number above' >&2; exit 1; fi"
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(source_names_concepts PROPERTIES LABELS unit TIMEOUT 60)

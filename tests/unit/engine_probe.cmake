# Engine probes in a child process (lib/backend/engine_probe.h) with fake probe bodies: the test
# binary starts itself as the child (its own main() answers the hidden subcommand), so it has no
# gtest_main.
add_executable(backend_engine_probe_test ${CMAKE_CURRENT_LIST_DIR}/backend_engine_probe_test.cpp)
target_link_libraries(backend_engine_probe_test PRIVATE kilter_lib GTest::gtest)
add_test(NAME backend_engine_probe_test COMMAND backend_engine_probe_test)
set_tests_properties(backend_engine_probe_test PROPERTIES LABELS unit TIMEOUT 120)

# Fuzz harnesses (issue 17): one tests/fuzz/fuzz_<name>.cpp per harness, each defining
# LLVMFuzzerTestOneInput. Two builds use them:
# - every build (gcc included): `fuzz_replay`, one driver linking every harness, runs each over its
#   seed corpus (tests/fuzz/corpus/<name>/) and its regression inputs (tests/fuzz/regressions/<name>/),
#   as the unit tests fuzz_replay_<name>; so every finding stays fixed in every CI build;
# - KILTER_FUZZ=ON (clang only, CUDA off; bench/fuzz.sh configures it in build-fuzz): kilter's
#   code is compiled with -fsanitize=fuzzer-no-link,address,undefined and each harness is linked
#   with -fsanitize=fuzzer into its own libFuzzer binary fuzz_<name> (target fuzz_all builds them).
option(KILTER_FUZZ "Build the libFuzzer harnesses of tests/fuzz (needs clang, ENABLE_CUDA=OFF)" OFF)

set(KILTER_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
set(KILTER_FUZZ_HARNESSES
    text jsonl fortune sentencepiece tokenizer_json bpe_encode config_ini config_override
    import_llmc import_nanogpt import_megatron import_npy dataset checkpoint safetensors)

# The INI parser lives in kilter_lib; the harnesses need only lib/core/config.cpp from it, so the
# fuzz build compiles that file on its own instead of all of kilter_lib.
function(kilter_fuzz_link_kilter target)
  target_link_libraries(${target} PRIVATE kilter_io Boost::program_options)
  target_compile_definitions(${target} PRIVATE
      KILTER_FUZZ_SEED_DIR="${KILTER_FUZZ_DIR}/corpus")
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR} ${KILTER_FUZZ_DIR})
endfunction()

# ---- the replay driver: every build ------------------------------------------------------------
set(kilter_fuzz_replay_sources ${KILTER_FUZZ_DIR}/replay_main.cpp ${CMAKE_SOURCE_DIR}/lib/core/config.cpp)
foreach(h ${KILTER_FUZZ_HARNESSES})
  # Each harness's entry point gets its own name in the one replay binary (a generated wrapper, so
  # the libFuzzer build compiles the same source unrenamed).
  set(wrapper ${CMAKE_BINARY_DIR}/fuzz_replay_sources/replay_${h}.cpp)
  file(CONFIGURE OUTPUT ${wrapper} CONTENT
       "#define LLVMFuzzerTestOneInput kilter_fuzz_${h}\n#include \"fuzz_${h}.cpp\"\n")
  list(APPEND kilter_fuzz_replay_sources ${wrapper})
endforeach()
add_executable(fuzz_replay ${kilter_fuzz_replay_sources})
kilter_fuzz_link_kilter(fuzz_replay)
foreach(h ${KILTER_FUZZ_HARNESSES})
  add_test(NAME fuzz_replay_${h}
           COMMAND fuzz_replay ${h} ${KILTER_FUZZ_DIR}/corpus/${h} ${KILTER_FUZZ_DIR}/regressions/${h})
  set_tests_properties(fuzz_replay_${h} PROPERTIES LABELS unit TIMEOUT 300)
endforeach()

# ---- the libFuzzer build: KILTER_FUZZ=ON only ----------------------------------------------------
if(KILTER_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "KILTER_FUZZ=ON needs clang: configure with CC=clang CXX=clang++")
  endif()
  if(KILTER_WITH_CUDA)
    message(FATAL_ERROR "KILTER_FUZZ=ON needs ENABLE_CUDA=OFF")
  endif()
  set(kilter_fuzz_flags -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
      -fno-omit-frame-pointer -g)
  # All of kilter's code is instrumented; whatever links it gets the sanitizer runtimes.
  foreach(lib kilter_io kilter_lib)
    target_compile_options(${lib} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${kilter_fuzz_flags}>)
    target_link_options(${lib} INTERFACE -fsanitize=address,undefined)
  endforeach()
  add_library(kilter_fuzz_config STATIC ${CMAKE_SOURCE_DIR}/lib/core/config.cpp)
  target_include_directories(kilter_fuzz_config PRIVATE ${CMAKE_SOURCE_DIR})
  target_link_libraries(kilter_fuzz_config PUBLIC kilter_io Boost::program_options)
  target_compile_options(kilter_fuzz_config PRIVATE ${kilter_fuzz_flags})
  add_custom_target(fuzz_all)
  foreach(h ${KILTER_FUZZ_HARNESSES})
    add_executable(fuzz_${h} ${KILTER_FUZZ_DIR}/fuzz_${h}.cpp)
    kilter_fuzz_link_kilter(fuzz_${h})
    target_link_libraries(fuzz_${h} PRIVATE kilter_fuzz_config)
    target_compile_options(fuzz_${h} PRIVATE ${kilter_fuzz_flags})
    target_link_options(fuzz_${h} PRIVATE -fsanitize=fuzzer,address,undefined)
    add_dependencies(fuzz_all fuzz_${h})
  endforeach()
endif()

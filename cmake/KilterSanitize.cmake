# Sanitizer builds (issue 17): -DKILTER_SANITIZE=address,undefined (ASan + UBSan) or thread (TSan)
# compiles and links every target with the sanitizer, frame pointers, line tables (-g1) and -O1,
# so a report names the line. UBSan gets -fno-sanitize-recover=all: a report aborts the process, and the
# test fails. The CUDA backend is off in these builds (nvcc does not take host sanitizers, and the
# CPU machine runs no GPU test); asking for ENABLE_CUDA=ON as well is an error.
# Include it before KilterDeps (which reads ENABLE_CUDA) and before any target is defined.
# The run-time options and suppressions live in tests/sanitizers/ (cmake/KilterTesting.cmake
# passes them to every test); scripts/sanitize.sh builds and runs the selected tests.
set(KILTER_SANITIZE "" CACHE STRING "Sanitizer build: address,undefined | thread (CUDA off); empty: none")
set_property(CACHE KILTER_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")

set(KILTER_SANITIZE_KIND "")   # asan (address,undefined) | tsan (thread) | empty
if(KILTER_SANITIZE)
  string(REPLACE " " "" _kilter_sanitize "${KILTER_SANITIZE}")
  if(_kilter_sanitize STREQUAL "address,undefined" OR _kilter_sanitize STREQUAL "undefined,address")
    set(KILTER_SANITIZE_KIND asan)
    set(_kilter_sanitize address,undefined)
  elseif(_kilter_sanitize STREQUAL "thread")
    set(KILTER_SANITIZE_KIND tsan)
  else()
    message(FATAL_ERROR "KILTER_SANITIZE='${KILTER_SANITIZE}' is not a sanitizer build kilter knows: "
                        "use -DKILTER_SANITIZE=address,undefined or -DKILTER_SANITIZE=thread (or leave it empty)")
  endif()
  if(ENABLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KILTER_SANITIZE=${KILTER_SANITIZE} builds without CUDA, but ENABLE_CUDA=ON was asked for: "
                        "drop -DENABLE_CUDA=ON (or use a separate build directory for the CUDA build)")
  endif()
  set(ENABLE_CUDA OFF CACHE STRING "Build the CUDA backend (AUTO|ON|OFF)" FORCE)

  # -g1: line tables and function names, what a report's stack needs; the full -g of
  # RelWithDebInfo (types, locals) made the ASan build of every target about 28% slower to compile.
  set(KILTER_SANITIZE_FLAGS -fsanitize=${_kilter_sanitize} -fno-omit-frame-pointer -g1 -O1)
  if(KILTER_SANITIZE_KIND STREQUAL "asan")
    list(APPEND KILTER_SANITIZE_FLAGS -fno-sanitize-recover=all)
  endif()
  # After the build type's flags on the command line, so -O1 replaces Release's -O3.
  add_compile_options(${KILTER_SANITIZE_FLAGS})
  add_link_options(-fsanitize=${_kilter_sanitize})
  string(REPLACE ";" " " _kilter_sanitize_flags_str "${KILTER_SANITIZE_FLAGS}")
  message(STATUS "kilter: sanitizer build: ${_kilter_sanitize} (${_kilter_sanitize_flags_str}; CUDA off; "
                 "run-time options from tests/sanitizers/)")
endif()

# GPU tier (label gpu): the op table (every kernel vs its CPU twin), the CUDA model vs the CPU
# model, and the GPU step benchmark. Built only with CUDA. The binaries link the model sources, the
# kernels, the CUDA libraries and GoogleTest (statically) only (no MPI, HDF5, Boost), so the same
# targets build on a GPU machine through tests/gpu/standalone/. Without a device each test is
# skipped (GTEST_SKIP), the binary prints "SKIPPED: no CUDA device (...)" and exits 77, which
# ctest reports as skipped. The op table's CPU part (its completeness, the bf16 twins against the
# fp32 ops) is tests/unit/op_table.cmake, in every build.

# kilter_gpu_core in this build: an archive of the objects kilter_base and kilter_lib already
# compiled from the same sources with the same flags (-O3, the same CUDA architectures), not a
# second compile of them (the core's CUDA files were most of the CUDA build's time). The standalone
# build compiles the list itself. The archive still holds only the standalone list's objects, and
# the GPU binaries link it without MPI, HDF5 or Boost, so a source the list misses still fails
# their link here. A source of the list that neither library compiles (none today) is compiled here.
# The defines kilter_link_gpu gives the libraries (KILTER_WITH_CUDA, KILTER_WITH_NCCL) change only
# lib/backend/select.cpp, lib/comm/ and lib/train/ files, none of them in the list.
function(kilter_add_gpu_core_from_objects)
  set(objects "")
  set(own_sources "")
  foreach(library kilter_base kilter_lib)
    get_target_property(${library}_sources ${library} SOURCES)
  endforeach()
  foreach(source ${KILTER_GPU_CORE_SOURCES})
    set(owner "")
    foreach(library kilter_base kilter_lib)
      if(source IN_LIST ${library}_sources)
        set(owner ${library})
      endif()
    endforeach()
    if(owner STREQUAL "")
      list(APPEND own_sources ${source})
      continue()
    endif()
    # The object's name as CMake's Makefile and Ninja generators give it:
    # CMakeFiles/<target>.dir/<path>.o, which TARGET_OBJECTS writes <target>.dir/./<path>.o.
    file(RELATIVE_PATH relative ${CMAKE_SOURCE_DIR} ${source})
    string(REGEX REPLACE "([.+])" "\\\\\\1" relative "${relative}")
    list(APPEND objects "$<FILTER:$<TARGET_OBJECTS:${owner}>,INCLUDE,/${owner}\\.dir/(\\./)?${relative}\\.o$>")
  endforeach()
  add_library(kilter_gpu_core STATIC ${objects} ${own_sources})
  set_target_properties(kilter_gpu_core PROPERTIES LINKER_LANGUAGE CXX)
  add_dependencies(kilter_gpu_core kilter_base kilter_lib)
endfunction()

if(KILTER_WITH_CUDA)
  set(KILTER_GPU_ROOT ${CMAKE_SOURCE_DIR})
  include(${CMAKE_SOURCE_DIR}/tests/gpu/standalone/sources.cmake)
  kilter_add_gpu_core_from_objects()
  target_include_directories(kilter_gpu_core PUBLIC ${CMAKE_SOURCE_DIR})
  target_link_libraries(kilter_gpu_core PUBLIC CUDA::cudart kilter::blas Threads::Threads ${CMAKE_DL_LIBS})
  kilter_link_cudnn(kilter_gpu_core)

  # The device tests (tests/gpu/standalone/sources.cmake: KILTER_GPU_TESTS), GoogleTest binaries
  # that exit 77 (skipped) where no device is usable. gpu_op_table: the op table, first.
  foreach(test_name ${KILTER_GPU_TESTS})
    kilter_add_gpu_test_binary(${test_name} GTest::gtest)
    add_test(NAME ${test_name} COMMAND kilter_${test_name}_test)
    set_tests_properties(${test_name} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
  endforeach()

  # The NCCL communicator needs MPI (kilter_lib) and one GPU per rank: 1 rank here, more on a
  # multi-GPU node by hand (mpirun -np <gpus> kilter_gpu_nccl_test).
  if(KILTER_WITH_NCCL)
    add_executable(kilter_gpu_nccl_test ${CMAKE_SOURCE_DIR}/tests/gpu/gpu_nccl_test.cpp)
    target_link_libraries(kilter_gpu_nccl_test PRIVATE kilter_lib GTest::gtest)
    add_test(NAME gpu_nccl COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 ${KILTER_MPIRUN_FLAGS}
                                   $<TARGET_FILE:kilter_gpu_nccl_test>)
    set_tests_properties(gpu_nccl PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300)
  endif()

  # The CUDA libraries loaded, their versions and files (device-check.sh's first step); it runs
  # without a device too (driver "none").
  add_executable(kilter_gpu_versions ${CMAKE_SOURCE_DIR}/tests/gpu/gpu_versions.cpp)
  target_link_libraries(kilter_gpu_versions PRIVATE kilter_gpu_core)
  add_test(NAME gpu_versions COMMAND kilter_gpu_versions)
  set_tests_properties(gpu_versions PROPERTIES LABELS gpu TIMEOUT 60)

  # Not a test: bench/gpu_step.sh and tests/gpu/device-check.sh run it.
  add_executable(kilter_bench_gpu_step ${CMAKE_SOURCE_DIR}/bench/gpu_step.cpp)
  target_link_libraries(kilter_bench_gpu_step PRIVATE kilter_gpu_core)

  # The bf16 loss curve against fp32's on a real corpus: 200 GPT-2-shaped steps in device-check.sh;
  # here its CPU form (fp32 model against the bf16-storage oracle, a small shape on the docs'
  # text), so the tool and its check are tested where there is no GPU.
  add_executable(kilter_gpu_loss_curve ${CMAKE_SOURCE_DIR}/tests/gpu/gpu_loss_curve.cpp)
  target_link_libraries(kilter_gpu_loss_curve PRIVATE kilter_gpu_core)
  add_test(NAME loss_curve_cpu COMMAND kilter_gpu_loss_curve --backend cpu --steps 40 --B 4 --T 64 --n-layer 2
                                       --n-head 2 --n-embd 64 --lr 3e-3 --tolerance 0.02 --every 10
                                       ${CMAKE_SOURCE_DIR}/docs/design.md ${CMAKE_SOURCE_DIR}/docs/model.md)
  set_tests_properties(loss_curve_cpu PROPERTIES LABELS "unit;no_asan" TIMEOUT 300)
endif()

# The sources of the GPU test and benchmark binaries, shared by tests/gpu/gpu.cmake (the main
# build) and tests/gpu/standalone/CMakeLists.txt (a GPU machine with only the CUDA toolkit):
# the CPU model (the oracle) and the CUDA model with its kernels. No MPI, HDF5 or Boost.
# KILTER_GPU_ROOT: the repository root.
file(GLOB KILTER_GPU_CORE_SOURCES CONFIGURE_DEPENDS
     ${KILTER_GPU_ROOT}/lib/model/*.cpp
     ${KILTER_GPU_ROOT}/lib/model/*.cu)
list(APPEND KILTER_GPU_CORE_SOURCES
     ${KILTER_GPU_ROOT}/io/base/error.cpp
     ${KILTER_GPU_ROOT}/lib/optim/adamw.cpp
     ${KILTER_GPU_ROOT}/lib/backend/model_base.cpp
     ${KILTER_GPU_ROOT}/lib/backend/cpu_model.cpp
     ${KILTER_GPU_ROOT}/io/base/cuda_device.cu
     ${KILTER_GPU_ROOT}/io/base/cuda_virtual_buffer.cu
     ${KILTER_GPU_ROOT}/lib/comm/unit_pages.cpp
     ${KILTER_GPU_ROOT}/io/base/cublaslt_loader_cuda.cpp
     ${KILTER_GPU_ROOT}/lib/backend/cuda_memory.cpp
     ${KILTER_GPU_ROOT}/lib/backend/cuda_model.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_arena.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_graphs.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_attention_choice.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_attention_sdpa.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_datapath_bf16.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_optimizer.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_self_check.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_versions_cuda.cpp)
# cuDNN files (lib/model/*cudnn*) need KILTER_WITH_CUDNN, like in the main build.
if(NOT KILTER_WITH_CUDNN)
  list(FILTER KILTER_GPU_CORE_SOURCES EXCLUDE REGEX ".*cudnn.*")
endif()
# The SDPA engine's frontend file (cmake/KilterCudnn.cmake: KILTER_WITH_SDPA) is built where the
# cudnn-frontend headers are found, as in the main build, and left out otherwise.
if(NOT KILTER_WITH_SDPA)
  list(FILTER KILTER_GPU_CORE_SOURCES EXCLUDE REGEX "${KILTER_SDPA_FRONTEND_SOURCE_REGEX}")
endif()

# The device test binaries (GoogleTest, one main: tests/gpu/gpu_test_main.cpp, which exits 77
# where no device is usable): kilter_<name>_test from tests/gpu/<name>_test.cpp. gpu_op_table is
# the op table (tests/gpu/op_table.h): every kernel against its CPU twin; gpu_sdpa is added where
# the cuDNN SDPA engine is built (KILTER_WITH_SDPA); gpu_vmm: the sparsely backed buffers of
# train.shard = parameters.
set(KILTER_GPU_TESTS gpu_op_table gpu_model gpu_bf16_model gpu_cut gpu_distributed_optimizer gpu_vmm)
if(KILTER_WITH_SDPA)
  list(APPEND KILTER_GPU_TESTS gpu_sdpa)
endif()
set(KILTER_GPU_OP_TABLE_SOURCES
    ${KILTER_GPU_ROOT}/tests/gpu/op_table_cases.cpp
    ${KILTER_GPU_ROOT}/tests/gpu/op_table_fp32.cpp
    ${KILTER_GPU_ROOT}/tests/gpu/op_table_attention.cpp
    ${KILTER_GPU_ROOT}/tests/gpu/op_table_bf16.cpp)

# kilter_add_gpu_test_binary(name gtest): the binary kilter_<name>_test, linked to kilter_gpu_core
# and the GoogleTest library target `gtest` (statically: Debian's libgtest.a, or one built from
# /usr/src/googletest), so that it runs on a GPU machine without GoogleTest.
function(kilter_add_gpu_test_binary name gtest)
  set(sources ${KILTER_GPU_ROOT}/tests/gpu/${name}_test.cpp ${KILTER_GPU_ROOT}/tests/gpu/gpu_test_main.cpp)
  if(name STREQUAL "gpu_op_table")
    list(APPEND sources ${KILTER_GPU_OP_TABLE_SOURCES})
  endif()
  add_executable(kilter_${name}_test ${sources})
  target_link_libraries(kilter_${name}_test PRIVATE kilter_gpu_core ${gtest})
endfunction()

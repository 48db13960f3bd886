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
     ${KILTER_GPU_ROOT}/lib/backend/cpu_model_bf16.cpp
     ${KILTER_GPU_ROOT}/io/base/cuda_device.cu
     ${KILTER_GPU_ROOT}/io/base/cublaslt_loader_cuda.cpp
     ${KILTER_GPU_ROOT}/lib/backend/cuda_memory.cpp
     ${KILTER_GPU_ROOT}/lib/backend/cuda_model.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_arena.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_graphs.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_attention_choice.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_attention_sdpa.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_datapath_bf16.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_optimizer.cu
     ${KILTER_GPU_ROOT}/lib/backend/cuda_self_check.cu)
# cuDNN files (lib/model/*cudnn*) need KILTER_WITH_CUDNN, like in the main build.
if(NOT KILTER_WITH_CUDNN)
  list(FILTER KILTER_GPU_CORE_SOURCES EXCLUDE REGEX ".*cudnn.*")
endif()
# The SDPA engine's frontend file (cmake/KilterCudnn.cmake: KILTER_WITH_SDPA) is built where the
# cudnn-frontend headers are found, as in the main build, and left out otherwise.
if(NOT KILTER_WITH_SDPA)
  list(FILTER KILTER_GPU_CORE_SOURCES EXCLUDE REGEX "${KILTER_SDPA_FRONTEND_SOURCE_REGEX}")
endif()

# Finds kilter's dependencies and decides which GPU backends are compiled.
# ENABLE_CUDA / ENABLE_CUDNN / ENABLE_NCCL: AUTO (default) turns a backend on when it is found;
# ON makes a missing piece an error; OFF skips it.
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT TARGET hdf5::hdf5)
  add_library(hdf5::hdf5 INTERFACE IMPORTED)
  target_include_directories(hdf5::hdf5 INTERFACE ${HDF5_INCLUDE_DIRS})
  target_link_libraries(hdf5::hdf5 INTERFACE ${HDF5_LIBRARIES})
  target_compile_definitions(hdf5::hdf5 INTERFACE ${HDF5_DEFINITIONS})
endif()
find_package(Boost 1.70 REQUIRED COMPONENTS program_options)
find_package(nlohmann_json 3 REQUIRED)
find_package(fmt REQUIRED)
find_package(GTest)

# Tokenizers (io/tokenizer/*.cpp): SentencePiece (libsentencepiece-dev, no CMake package: found
# by pkg-config), PCRE2 for tokenizer.json split regexes, ICU for its Unicode normalizers.
find_package(PkgConfig REQUIRED)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
find_package(ICU REQUIRED COMPONENTS uc)
find_library(SENTENCEPIECE_TRAIN_LIBRARY sentencepiece_train HINTS ${SENTENCEPIECE_LIBRARY_DIRS} REQUIRED)
# Compressed corpora for `kilter prep` (io/compressed_input.cpp): zlib (zlib1g-dev) for .gz,
# libzstd (libzstd-dev, found by pkg-config) for .zst.
find_package(ZLIB REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
add_library(kilter::text INTERFACE IMPORTED)
target_link_libraries(kilter::text INTERFACE PkgConfig::SENTENCEPIECE ${SENTENCEPIECE_TRAIN_LIBRARY}
                      PkgConfig::PCRE2 ICU::uc nlohmann_json::nlohmann_json ZLIB::ZLIB PkgConfig::ZSTD)

# The CPU GEMM engine behind kilter::blas (lib/model/gemm.cpp). oneDNN (Debian libdnnl-dev) picks
# its AVX-512 / AVX512_BF16 / AMX kernels at run time and gives bf16 GEMMs (train.precision=bf16 on
# the CPU backend); its OpenMP runtime takes the thread count (train.threads). Without oneDNN the
# build falls back to OpenBLAS (fp32 only; Debian pins it to AVX2 kernels on some CPUs, about half
# the fp32 rate). ENABLE_ONEDNN: AUTO (default) | ON (missing oneDNN is an error) | OFF.
set(ENABLE_ONEDNN AUTO CACHE STRING "CPU GEMMs through oneDNN (AUTO|ON|OFF)")
set(KILTER_CPU_GEMM "")
if(NOT ENABLE_ONEDNN STREQUAL "OFF")
  find_path(KILTER_DNNL_INCLUDE oneapi/dnnl/dnnl.h)
  find_library(KILTER_DNNL_LIBRARY dnnl)
  find_package(OpenMP COMPONENTS CXX)
  if(KILTER_DNNL_INCLUDE AND KILTER_DNNL_LIBRARY AND OpenMP_CXX_FOUND)
    file(STRINGS ${KILTER_DNNL_INCLUDE}/oneapi/dnnl/dnnl_version.h _dnnl_version REGEX "define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE "[^0-9;]" "" _dnnl_version "${_dnnl_version}")
    string(REPLACE ";" "." _dnnl_version "${_dnnl_version}")
    add_library(kilter::blas INTERFACE IMPORTED)
    target_include_directories(kilter::blas INTERFACE ${KILTER_DNNL_INCLUDE})
    target_link_libraries(kilter::blas INTERFACE ${KILTER_DNNL_LIBRARY} OpenMP::OpenMP_CXX)
    target_compile_definitions(kilter::blas INTERFACE KILTER_WITH_ONEDNN=1)
    set(KILTER_CPU_GEMM "oneDNN ${_dnnl_version} (fp32 + bf16, OpenMP threads)")
  elseif(ENABLE_ONEDNN STREQUAL "ON")
    message(FATAL_ERROR "ENABLE_ONEDNN=ON but oneDNN (oneapi/dnnl/dnnl.h, libdnnl) or OpenMP was not found "
                        "(apt-get install libdnnl-dev, or scripts/install-deps.sh)")
  endif()
endif()
if(KILTER_CPU_GEMM STREQUAL "")
  # OpenBLAS: prefer the pthreads build (openblas_set_num_threads works); BLA_VENDOR pins it.
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS REQUIRED)
  find_path(KILTER_CBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread
            /usr/include/openblas /usr/include/x86_64-linux-gnu /usr/include)
  add_library(kilter::blas INTERFACE IMPORTED)
  target_link_libraries(kilter::blas INTERFACE ${BLAS_LIBRARIES})
  target_include_directories(kilter::blas INTERFACE ${KILTER_CBLAS_INCLUDE})
  set(KILTER_CPU_GEMM "OpenBLAS (fp32 only; oneDNN not found: apt-get install libdnnl-dev)")
endif()
message(STATUS "kilter: CPU GEMM engine: ${KILTER_CPU_GEMM}")

set(KILTER_BACKENDS "cpu mpi")
set(ENABLE_CUDA AUTO CACHE STRING "Build the CUDA backend (AUTO|ON|OFF)")
set(ENABLE_NCCL AUTO CACHE STRING "Build the NCCL communicator (AUTO|ON|OFF)")
set(KILTER_WITH_CUDA OFF)
set(KILTER_WITH_NCCL OFF)

if(NOT ENABLE_CUDA STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # The GPUs to compile for: the ones in this machine when nvidia-smi sees any ("native", CMake
    # >= 3.24), else A100 and H100/H200 (80;90). -DCMAKE_CUDA_ARCHITECTURES=86;89 (A40, L40) etc.
    # overrides; the choice is printed, since a kernel built for another GPU fails only at run time.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(_kilter_gpu_seen OFF)
      find_program(KILTER_NVIDIA_SMI nvidia-smi)
      if(KILTER_NVIDIA_SMI)
        execute_process(COMMAND ${KILTER_NVIDIA_SMI} -L RESULT_VARIABLE _smi_rc OUTPUT_VARIABLE _smi_out
                        ERROR_QUIET TIMEOUT 20)
        if(_smi_rc EQUAL 0 AND _smi_out MATCHES "GPU [0-9]")
          set(_kilter_gpu_seen ON)
        endif()
      endif()
      if(_kilter_gpu_seen AND CMAKE_VERSION VERSION_GREATER_EQUAL 3.24)
        set(CMAKE_CUDA_ARCHITECTURES native)
        set(_kilter_arch_why "the GPUs nvidia-smi sees")
      else()
        set(CMAKE_CUDA_ARCHITECTURES "80;90")
        set(_kilter_arch_why "no GPU visible at configure time: A100 and H100/H200")
      endif()
      message(STATUS "kilter: CMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES} (${_kilter_arch_why}; "
                     "set -DCMAKE_CUDA_ARCHITECTURES=... for other GPUs, e.g. 86;89 for A40/L40)")
    else()
      message(STATUS "kilter: CMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES} (given)")
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    find_package(CUDAToolkit REQUIRED)
    set(KILTER_WITH_CUDA ON)
    set(KILTER_BACKENDS "${KILTER_BACKENDS} cuda")
  elseif(ENABLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ENABLE_CUDA=ON but no CUDA compiler was found")
  endif()
endif()

include(KilterCudnn)  # ENABLE_CUDNN, KILTER_WITH_CUDNN, kilter_link_cudnn()
if(KILTER_WITH_CUDNN)
  set(KILTER_BACKENDS "${KILTER_BACKENDS} cudnn")
endif()
if(KILTER_WITH_SDPA)
  set(KILTER_BACKENDS "${KILTER_BACKENDS} sdpa")
endif()

if(KILTER_WITH_CUDA)
  get_filename_component(_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  if(NOT ENABLE_NCCL STREQUAL "OFF")
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_cuda_root}/include ENV NCCL_ROOT PATH_SUFFIXES include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${_cuda_root}/lib64 ENV NCCL_ROOT PATH_SUFFIXES lib lib64)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(KILTER_WITH_NCCL ON)
      set(KILTER_BACKENDS "${KILTER_BACKENDS} nccl")
    elseif(ENABLE_NCCL STREQUAL "ON")
      message(FATAL_ERROR "ENABLE_NCCL=ON but nccl.h/libnccl were not found (set NCCL_ROOT)")
    endif()
  endif()
endif()

# Links the GPU libraries into a target and defines KILTER_WITH_* for the one place that picks
# a backend (lib/backend/select.cpp, lib/comm/select.cpp, app/cmd_version).
function(kilter_link_gpu target)
  if(KILTER_WITH_CUDA)
    target_compile_definitions(${target} PUBLIC KILTER_WITH_CUDA=1)
    # cuBLASLt is not linked: io/base/cublaslt_loader_cuda.cpp opens it on first use (a
    # linked one costs every rank, CPU ones too, ~150 MiB of resident memory at start-up).
    set_source_files_properties(${PROJECT_SOURCE_DIR}/io/base/cublaslt_loader_cuda.cpp PROPERTIES
                                COMPILE_DEFINITIONS "KILTER_CUDA_LIBRARY_DIR=\"${CUDAToolkit_LIBRARY_DIR}\"")
    target_link_libraries(${target} PUBLIC CUDA::cudart ${CMAKE_DL_LIBS})
    set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
  endif()
  kilter_link_cudnn(${target})
  if(KILTER_WITH_NCCL)
    target_compile_definitions(${target} PUBLIC KILTER_WITH_NCCL=1)
    target_include_directories(${target} PUBLIC ${NCCL_INCLUDE_DIR})
    target_link_libraries(${target} PUBLIC ${NCCL_LIBRARY})
  endif()
endfunction()

# cuDNN for the attention engine, shared by the main build (cmake/KilterDeps.cmake) and the
# standalone GPU build (tests/gpu/standalone). Include it after the CUDA toolkit was found and
# KILTER_WITH_CUDA set. ENABLE_CUDNN: AUTO (use cuDNN when cudnn.h and libcudnn are in the
# toolkit's folders or CUDNN_ROOT), ON (an error when they are not), OFF.
# Sets KILTER_WITH_CUDNN, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY; defines kilter_link_cudnn(target).
set(ENABLE_CUDNN AUTO CACHE STRING "Use cuDNN attention in the CUDA backend (AUTO|ON|OFF)")
set(KILTER_WITH_CUDNN OFF)
if(KILTER_WITH_CUDA AND NOT ENABLE_CUDNN STREQUAL "OFF")
  get_filename_component(_kilter_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_kilter_cuda_root}/include ENV CUDNN_ROOT
            PATH_SUFFIXES include)
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${_kilter_cuda_root}/lib64 ENV CUDNN_ROOT
               PATH_SUFFIXES lib lib64)
  if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
    set(KILTER_WITH_CUDNN ON)
  elseif(ENABLE_CUDNN STREQUAL "ON")
    message(FATAL_ERROR "ENABLE_CUDNN=ON but cudnn.h/libcudnn were not found (set CUDNN_ROOT)")
  endif()
endif()

# cuDNN's fused flash attention (SDPA) through cudnn-frontend's header-only C++ API
# (lib/model/attention_sdpa_cuda.cpp, the one file that includes cudnn_frontend.h). ENABLE_SDPA: AUTO
# (build it when cuDNN is on and the headers are found), ON (an error when they are not), OFF.
# The headers: -DCUDNN_FRONTEND_INCLUDE_DIR=..., or where scripts/install-deps.sh puts them
# (/opt/kilter/cudnn-frontend/include), $CUDNN_FRONTEND_ROOT/include, /usr/local/include, or the
# include/ folder of a pip-installed nvidia-cudnn-frontend. Sets KILTER_WITH_SDPA and
# CUDNN_FRONTEND_VERSION; kilter_link_cudnn(target) then defines KILTER_WITH_SDPA=1 for it.
set(ENABLE_SDPA AUTO CACHE STRING "cuDNN SDPA (flash) attention through cudnn-frontend (AUTO|ON|OFF)")
set(KILTER_WITH_SDPA OFF)
set(CUDNN_FRONTEND_VERSION "")
if(KILTER_WITH_CUDNN AND NOT ENABLE_SDPA STREQUAL "OFF")
  set(_kilter_cfe_hints /opt/kilter/cudnn-frontend/include)
  if(DEFINED ENV{CUDNN_FRONTEND_ROOT})
    list(APPEND _kilter_cfe_hints $ENV{CUDNN_FRONTEND_ROOT}/include $ENV{CUDNN_FRONTEND_ROOT})
  endif()
  file(GLOB _kilter_cfe_wheels /usr/lib/python3*/site-packages/include /usr/local/lib/python3*/dist-packages/include
       /usr/local/lib/python3*/site-packages/include)
  find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${_kilter_cfe_hints} PATHS /usr/local/include
            ${_kilter_cfe_wheels})
  if(CUDNN_FRONTEND_INCLUDE_DIR AND EXISTS ${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h)
    file(STRINGS ${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h _cfe_version
         REGEX "define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION ")
    string(REGEX REPLACE "[^0-9;]" "" _cfe_version "${_cfe_version}")
    string(REPLACE ";" "." CUDNN_FRONTEND_VERSION "${_cfe_version}")
  endif()
  # The SDPA graphs kilter builds (ragged offsets with grouped-query heads, the bottom-right
  # causal mask with padding) need frontend >= 1.8; 1.32.0 is the version tested.
  if(CUDNN_FRONTEND_VERSION AND CUDNN_FRONTEND_VERSION VERSION_GREATER_EQUAL 1.8)
    set(KILTER_WITH_SDPA ON)
  elseif(ENABLE_SDPA STREQUAL "ON")
    message(FATAL_ERROR "ENABLE_SDPA=ON but cudnn-frontend >= 1.8 (cudnn_frontend.h) was not found"
                        "${CUDNN_FRONTEND_VERSION}: run scripts/install-deps.sh or set -DCUDNN_FRONTEND_INCLUDE_DIR")
  endif()
elseif(ENABLE_SDPA STREQUAL "ON")
  message(FATAL_ERROR "ENABLE_SDPA=ON needs cuDNN (ENABLE_CUDNN) and the CUDA toolkit")
endif()
if(KILTER_WITH_SDPA)
  message(STATUS "kilter: cuDNN SDPA attention: built (cudnn-frontend ${CUDNN_FRONTEND_VERSION}, ${CUDNN_FRONTEND_INCLUDE_DIR})")
elseif(KILTER_WITH_CUDNN)
  message(STATUS "kilter: cuDNN SDPA attention: not built (cudnn-frontend headers not found: scripts/install-deps.sh "
                 "installs them, or -DCUDNN_FRONTEND_INCLUDE_DIR=...)")
else()
  message(STATUS "kilter: cuDNN SDPA attention: not built (no cuDNN)")
endif()

# The SDPA engine's source that includes cudnn_frontend.h: left out of a build without it. It holds
# no kernels, so it is host C++ (a *_cuda.cpp file) compiled once, not once per CUDA architecture.
set(KILTER_SDPA_FRONTEND_SOURCE_REGEX ".*/attention_sdpa_cuda\\.cpp$")

# Defines KILTER_WITH_CUDNN (and KILTER_WITH_SDPA) for `target` and links cuDNN, when cuDNN is on.
# The frontend's include folder goes to the one source that includes it (attention_sdpa_cuda.cpp), so
# no other file can start depending on it.
function(kilter_link_cudnn target)
  if(KILTER_WITH_CUDNN)
    target_compile_definitions(${target} PUBLIC KILTER_WITH_CUDNN=1)
    target_include_directories(${target} PUBLIC ${CUDNN_INCLUDE_DIR})
    target_link_libraries(${target} PUBLIC ${CUDNN_LIBRARY})
  endif()
  if(KILTER_WITH_SDPA)
    target_compile_definitions(${target} PUBLIC KILTER_WITH_SDPA=1)
    # The frontend's headers reference NVRTC (its run-time compiled engines); the toolkit has it.
    target_link_libraries(${target} PUBLIC CUDA::nvrtc)
    get_target_property(_sources ${target} SOURCES)
    list(FILTER _sources INCLUDE REGEX "${KILTER_SDPA_FRONTEND_SOURCE_REGEX}")
    # CUDNN_FRONTEND_SKIP_JSON_LIB: no nlohmann json (serialization only), about half the compile.
    set_property(SOURCE ${_sources} TARGET_DIRECTORY ${target} APPEND PROPERTY INCLUDE_DIRECTORIES ${CUDNN_FRONTEND_INCLUDE_DIR})
    set_property(SOURCE ${_sources} TARGET_DIRECTORY ${target} APPEND PROPERTY COMPILE_DEFINITIONS CUDNN_FRONTEND_SKIP_JSON_LIB)
    # -O1: it only builds graphs and fills variant packs, and its compile falls from 54 s and
    # 1.5 GB (-O3) to 28 s and 1.1 GB (g++ 12, one core).
    set_property(SOURCE ${_sources} TARGET_DIRECTORY ${target} APPEND PROPERTY COMPILE_OPTIONS -O1)
  endif()
endfunction()

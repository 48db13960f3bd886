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

# Defines KILTER_WITH_CUDNN for `target` and links cuDNN, when cuDNN is on.
function(kilter_link_cudnn target)
  if(KILTER_WITH_CUDNN)
    target_compile_definitions(${target} PUBLIC KILTER_WITH_CUDNN=1)
    target_include_directories(${target} PUBLIC ${CUDNN_INCLUDE_DIR})
    target_link_libraries(${target} PUBLIC ${CUDNN_LIBRARY})
  endif()
endfunction()

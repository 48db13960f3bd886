# Install layout (issue 9): `cmake --install BUILD --prefix PREFIX` puts
#   PREFIX/bin/kilter                                  (install(TARGETS) in CMakeLists.txt)
#   PREFIX/share/kilter/inputs/                        example configs, length-distribution specs
#   PREFIX/share/kilter/slurm/                         train.sbatch, prep.sbatch, site.env, helpers
#   PREFIX/share/doc/kilter/                           README.md and docs/*.md
#   PREFIX/modulefiles/kilter/<version>.lua            Lmod
#   PREFIX/modulefiles-tcl/kilter/<version>            Tcl (Environment Modules; Lmod reads it too)
# The modulefiles are written at install time so that they name the prefix actually installed
# to (--prefix and DESTDIR work), from modulefiles/*.in via modulefiles/write_modulefiles.cmake.
include(GNUInstallDirs)

set(KILTER_MODULE_PREREQS "" CACHE STRING
    "Modules the kilter modulefile loads first, space-separated (e.g. \"openmpi hdf5\"); empty: none")
set(KILTER_CUDA_MODULE "cuda" CACHE STRING
    "CUDA module the kilter modulefile loads when the CUDA backend is built (empty: none)")

# Directories of the shared libraries kilter links against that the dynamic loader would not
# search by itself (MPI, HDF5, CUDA from a module tree, not /usr/lib): the modulefile prepends
# them to LD_LIBRARY_PATH so the binary runs even when a prerequisite module is swapped out.
function(kilter_collect_library_dirs out_var)
  set(candidates ${MPI_CXX_LIBRARIES} ${HDF5_LIBRARIES} ${HDF5_C_LIBRARIES} ${BLAS_LIBRARIES}
                 ${Boost_PROGRAM_OPTIONS_LIBRARY_RELEASE} ${CUDNN_LIBRARY} ${NCCL_LIBRARY})
  foreach(target fmt::fmt Boost::program_options)
    if(TARGET ${target})
      foreach(prop IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_NONE IMPORTED_LOCATION)
        get_target_property(location ${target} ${prop})
        if(location)
          list(APPEND candidates ${location})
        endif()
      endforeach()
    endif()
  endforeach()
  set(dirs "")
  if(KILTER_WITH_CUDA AND CUDAToolkit_LIBRARY_DIR)
    list(APPEND dirs ${CUDAToolkit_LIBRARY_DIR})
  endif()
  set(system_dirs /lib /lib64 /usr/lib /usr/lib64 ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES}
                  ${CMAKE_C_IMPLICIT_LINK_DIRECTORIES})
  if(CMAKE_LIBRARY_ARCHITECTURE)
    list(APPEND system_dirs /lib/${CMAKE_LIBRARY_ARCHITECTURE} /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
  endif()
  set(system_real "")
  foreach(dir IN LISTS system_dirs)
    get_filename_component(real "${dir}" REALPATH)
    list(APPEND system_real "${real}")
  endforeach()
  foreach(lib IN LISTS candidates)
    if(IS_ABSOLUTE "${lib}" AND EXISTS "${lib}" AND lib MATCHES "\\.so")
      # A library counts as found by the loader when its directory, or the directory of the file
      # it links to, is a system one: Debian's .../openmpi/lib/libmpi.so points into the
      # multiarch directory, and /usr/lib/<arch>/libopenblas.so into an alternatives directory.
      get_filename_component(dir "${lib}" DIRECTORY)
      get_filename_component(dir "${dir}" REALPATH)
      get_filename_component(real_lib "${lib}" REALPATH)
      get_filename_component(real_dir "${real_lib}" DIRECTORY)
      if(NOT dir IN_LIST system_real AND NOT real_dir IN_LIST system_real)
        list(APPEND dirs "${dir}")
      endif()
    endif()
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  set(${out_var} "${dirs}" PARENT_SCOPE)
endfunction()

kilter_collect_library_dirs(_kilter_detected_library_dirs)
set(KILTER_MODULE_LIBRARY_PATH "${_kilter_detected_library_dirs}" CACHE STRING
    "Directories the modulefile prepends to LD_LIBRARY_PATH (default: non-system directories of kilter's shared libraries)")

set(_kilter_module_prereqs "${KILTER_MODULE_PREREQS}")
if(KILTER_WITH_CUDA AND NOT KILTER_CUDA_MODULE STREQUAL "")
  string(APPEND _kilter_module_prereqs " ${KILTER_CUDA_MODULE}")
endif()
string(STRIP "${_kilter_module_prereqs}" _kilter_module_prereqs)

# ---- data, scripts, documentation -------------------------------------------------------------
set(KILTER_SHARE_DIR ${CMAKE_INSTALL_DATADIR}/kilter)
install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/inputs/ DESTINATION ${KILTER_SHARE_DIR}/inputs
        FILES_MATCHING PATTERN "*.ini" PATTERN "*.md" PATTERN "*.txt" PATTERN "*.json")
install(PROGRAMS ${CMAKE_CURRENT_SOURCE_DIR}/slurm/train.sbatch ${CMAKE_CURRENT_SOURCE_DIR}/slurm/prep.sbatch
                 ${CMAKE_CURRENT_SOURCE_DIR}/slurm/stage-in.sh ${CMAKE_CURRENT_SOURCE_DIR}/slurm/kilter-task.sh
        DESTINATION ${KILTER_SHARE_DIR}/slurm)
install(FILES ${CMAKE_CURRENT_SOURCE_DIR}/slurm/site.env ${CMAKE_CURRENT_SOURCE_DIR}/slurm/README.md
        DESTINATION ${KILTER_SHARE_DIR}/slurm)
file(GLOB _kilter_docs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/docs/*.md)
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/README.md)
  list(APPEND _kilter_docs ${CMAKE_CURRENT_SOURCE_DIR}/README.md)
endif()
if(_kilter_docs)
  install(FILES ${_kilter_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR})
endif()

# ---- modulefiles: generated at install time for the real prefix ---------------------------------
install(CODE "
  set(KILTER_MODULE_ROOT \"\${CMAKE_INSTALL_PREFIX}\")
  set(KILTER_VERSION \"${PROJECT_VERSION}\")
  set(KILTER_BACKENDS \"${KILTER_BACKENDS}\")
  set(KILTER_MODULE_PREREQS \"${_kilter_module_prereqs}\")
  set(KILTER_MODULE_LIBRARY_PATH \"${KILTER_MODULE_LIBRARY_PATH}\")
  set(KILTER_MODULE_OUTPUT_DIR \"${CMAKE_CURRENT_BINARY_DIR}/modulefiles-install\")
  include(\"${CMAKE_CURRENT_SOURCE_DIR}/modulefiles/write_modulefiles.cmake\")
  file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/modulefiles/kilter\" TYPE FILE
       FILES \"\${KILTER_MODULEFILE_LUA}\")
  file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/modulefiles-tcl/kilter\" TYPE FILE
       FILES \"\${KILTER_MODULEFILE_TCL}\")
")

# Parquet input for `kilter prep --format parquet` through Apache Arrow's C++ Parquet reader.
# ENABLE_PARQUET: AUTO (build it where Arrow and Parquet are found), ON (an error where they are
# not), OFF. Where to find them, in order:
#   1. an Arrow C++ install with its CMake packages (Spack `arrow +parquet`, conda-forge
#      `libarrow`/`libparquet`, a source build): ArrowConfig/ParquetConfig on CMAKE_PREFIX_PATH;
#   2. PyPI's pyarrow wheel, which ships the headers and libarrow/libparquet: KILTER_PYARROW_PYTHON
#      (default: the venv scripts/install-deps.sh makes, /opt/kilter/pyarrow-venv) names the python
#      that imports it; pyarrow.get_include() and get_library_dirs() give the folders, and
#      create_library_symlinks() the unversioned names a linker wants (docs/data.md: the wheel's
#      C++ ABI against this compiler).
# Arrow's headers need C++20: the reader (io/parquet_input.cpp) is a target of its own,
# kilter_parquet, built as C++20; the rest of io/ sees only io/parquet_input.h. Without it,
# io/parquet_input_none.cpp says what to install.
# Sets KILTER_WITH_PARQUET, KILTER_PARQUET_SOURCE (what was found, for the configure summary) and
# defines kilter_add_parquet(target).
set(ENABLE_PARQUET AUTO CACHE STRING "Parquet input for kilter prep through Apache Arrow C++ (AUTO|ON|OFF)")
set(KILTER_PYARROW_PYTHON /opt/kilter/pyarrow-venv/bin/python CACHE FILEPATH
    "A python that imports pyarrow (its wheel ships Arrow's C++ headers and libraries)")
set(KILTER_WITH_PARQUET OFF)
set(KILTER_PARQUET_SOURCE "")

if(NOT ENABLE_PARQUET STREQUAL "OFF")
  find_package(Parquet CONFIG QUIET)
  if(Parquet_FOUND AND TARGET Parquet::parquet_shared)
    add_library(kilter::parquet INTERFACE IMPORTED)
    target_link_libraries(kilter::parquet INTERFACE Parquet::parquet_shared)
    set(KILTER_WITH_PARQUET ON)
    set(KILTER_PARQUET_SOURCE "Arrow ${Parquet_VERSION} (CMake package, ${Parquet_DIR})")
  elseif(EXISTS "${KILTER_PYARROW_PYTHON}")
    execute_process(
      COMMAND "${KILTER_PYARROW_PYTHON}" -c
              "import pyarrow as pa; pa.create_library_symlinks(); print(pa.__version__); print(pa.get_include()); print(pa.get_library_dirs()[0])"
      OUTPUT_VARIABLE _kilter_pyarrow ERROR_VARIABLE _kilter_pyarrow_error RESULT_VARIABLE _kilter_pyarrow_rc
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_kilter_pyarrow_rc EQUAL 0)
      string(REPLACE "\n" ";" _kilter_pyarrow "${_kilter_pyarrow}")
      list(GET _kilter_pyarrow 0 _kilter_pyarrow_version)
      list(GET _kilter_pyarrow 1 _kilter_pyarrow_include)
      list(GET _kilter_pyarrow 2 _kilter_pyarrow_libdir)
      find_library(KILTER_ARROW_LIBRARY arrow PATHS "${_kilter_pyarrow_libdir}" NO_DEFAULT_PATH)
      find_library(KILTER_PARQUET_LIBRARY parquet PATHS "${_kilter_pyarrow_libdir}" NO_DEFAULT_PATH)
      if(KILTER_ARROW_LIBRARY AND KILTER_PARQUET_LIBRARY AND EXISTS "${_kilter_pyarrow_include}/parquet/arrow/reader.h")
        add_library(kilter::parquet INTERFACE IMPORTED)
        # SYSTEM: Arrow's headers warn under the project's flags; they are not ours to fix.
        target_include_directories(kilter::parquet SYSTEM INTERFACE "${_kilter_pyarrow_include}")
        target_link_libraries(kilter::parquet INTERFACE "${KILTER_PARQUET_LIBRARY}" "${KILTER_ARROW_LIBRARY}")
        # The wheel's folder is not on the loader's path: the binary records it (RUNPATH).
        target_link_options(kilter::parquet INTERFACE "LINKER:-rpath,${_kilter_pyarrow_libdir}")
        set(KILTER_WITH_PARQUET ON)
        set(KILTER_PARQUET_SOURCE "pyarrow ${_kilter_pyarrow_version} wheel (${_kilter_pyarrow_libdir})")
      endif()
    else()
      message(STATUS "kilter: ${KILTER_PYARROW_PYTHON} cannot import pyarrow: ${_kilter_pyarrow_error}")
    endif()
  endif()
  if(NOT KILTER_WITH_PARQUET AND ENABLE_PARQUET STREQUAL "ON")
    message(FATAL_ERROR "ENABLE_PARQUET=ON but Apache Arrow's Parquet C++ library was not found: run "
                        "scripts/install-deps.sh (pyarrow into /opt/kilter/pyarrow-venv), or point "
                        "CMAKE_PREFIX_PATH at an Arrow install (Spack arrow+parquet, conda-forge libparquet), "
                        "or -DKILTER_PYARROW_PYTHON=a python that imports pyarrow")
  endif()
endif()
if(KILTER_WITH_PARQUET)
  message(STATUS "kilter: Parquet input: ${KILTER_PARQUET_SOURCE}")
else()
  message(STATUS "kilter: Parquet input: off (scripts/install-deps.sh installs pyarrow; ENABLE_PARQUET=${ENABLE_PARQUET})")
endif()

# Adds the Parquet reader, or the file that says it is missing, to `target` (kilter_io).
function(kilter_add_parquet target)
  if(KILTER_WITH_PARQUET)
    # Objects of kilter_io itself (the reader uses io/base/error.h), compiled as C++20.
    add_library(kilter_parquet OBJECT ${CMAKE_SOURCE_DIR}/io/parquet_input.cpp)
    set_target_properties(kilter_parquet PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON)
    target_include_directories(kilter_parquet PRIVATE ${CMAKE_SOURCE_DIR})
    target_link_libraries(kilter_parquet PRIVATE kilter::parquet)
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:kilter_parquet>)
    target_link_libraries(${target} PUBLIC kilter::parquet)
  else()
    target_sources(${target} PRIVATE ${CMAKE_SOURCE_DIR}/io/parquet_input_none.cpp)
  endif()
endfunction()

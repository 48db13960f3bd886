# Writes kilter's modulefiles from the templates next to this file: the Lmod one
# (<out>/modulefiles/kilter/<version>.lua) and the Tcl one (<out>/modulefiles-tcl/kilter/<version>).
# Runs at install time (cmake/KilterInstall.cmake includes it from install(CODE), when the real
# prefix is known) and standalone, which tests use to try other prerequisite names:
#   cmake -DKILTER_MODULE_ROOT=/opt/kilter -DKILTER_VERSION=0.1.0 -DKILTER_BACKENDS="cpu mpi"
#         -DKILTER_MODULE_PREREQS="openmpi hdf5" [-DKILTER_MODULE_LIBRARY_PATH="/a;/b"]
#         -DKILTER_MODULE_OUTPUT_DIR=/tmp/out -P modulefiles/write_modulefiles.cmake
# Outputs: KILTER_MODULEFILE_LUA and KILTER_MODULEFILE_TCL (paths of the written files).

foreach(required KILTER_MODULE_ROOT KILTER_VERSION KILTER_MODULE_OUTPUT_DIR)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "write_modulefiles.cmake: ${required} is not set")
  endif()
endforeach()
if(NOT DEFINED KILTER_BACKENDS)
  set(KILTER_BACKENDS "cpu mpi")
endif()
get_filename_component(KILTER_MODULE_ROOT "${KILTER_MODULE_ROOT}" ABSOLUTE)

# Module names may be given with spaces ("openmpi hdf5") or as a CMake list.
string(REPLACE " " ";" _prereqs "${KILTER_MODULE_PREREQS}")
list(REMOVE_ITEM _prereqs "")
string(REPLACE " " ";" _libdirs "${KILTER_MODULE_LIBRARY_PATH}")
list(REMOVE_ITEM _libdirs "")

# Names and paths go verbatim into Lua strings and Tcl braces: refuse characters that would
# change their meaning there rather than escaping them differently for two languages.
foreach(name IN LISTS _prereqs)
  if(NOT name MATCHES "^[A-Za-z0-9_.+/-]+$")
    message(FATAL_ERROR "KILTER_MODULE_PREREQS: '${name}' is not a module name (letters, digits, _ . + / -)")
  endif()
endforeach()
foreach(path IN LISTS _libdirs ITEMS "${KILTER_MODULE_ROOT}")
  if(path MATCHES "[\"{}\\\\$]")
    message(FATAL_ERROR "kilter modulefiles: path '${path}' contains one of \" { } \\ $")
  endif()
endforeach()

set(KILTER_LUA_PREREQS "")
set(KILTER_TCL_PREREQS "")
foreach(name IN LISTS _prereqs)
  string(APPEND KILTER_LUA_PREREQS "depends_on(\"${name}\")\n")
  string(APPEND KILTER_TCL_PREREQS " ${name}")
endforeach()
if(_prereqs)
  string(REPLACE ";" " " KILTER_PREREQS_TEXT "${_prereqs}")
else()
  set(KILTER_LUA_PREREQS "-- (none configured)\n")
  set(KILTER_PREREQS_TEXT "none")
endif()

set(KILTER_LUA_LIBRARY_PATHS "")
set(KILTER_TCL_LIBRARY_PATHS "")
foreach(dir IN LISTS _libdirs)
  string(APPEND KILTER_LUA_LIBRARY_PATHS "prepend_path(\"LD_LIBRARY_PATH\", \"${dir}\")\n")
  string(APPEND KILTER_TCL_LIBRARY_PATHS "prepend-path LD_LIBRARY_PATH {${dir}}\n")
endforeach()
if(NOT _libdirs)
  set(KILTER_LUA_LIBRARY_PATHS "-- Shared libraries: all in the linker's default directories.\n")
  set(KILTER_TCL_LIBRARY_PATHS "# Shared libraries: all in the linker's default directories.\n")
endif()

set(KILTER_MODULEFILE_LUA "${KILTER_MODULE_OUTPUT_DIR}/modulefiles/kilter/${KILTER_VERSION}.lua")
set(KILTER_MODULEFILE_TCL "${KILTER_MODULE_OUTPUT_DIR}/modulefiles-tcl/kilter/${KILTER_VERSION}")
configure_file("${CMAKE_CURRENT_LIST_DIR}/kilter.lua.in" "${KILTER_MODULEFILE_LUA}" @ONLY)
configure_file("${CMAKE_CURRENT_LIST_DIR}/kilter.tcl.in" "${KILTER_MODULEFILE_TCL}" @ONLY)

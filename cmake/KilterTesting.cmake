# Test helpers shared by the tests/*/*.cmake fragments.
#   kilter_add_unit_test(name src...)       GoogleTest binary, label unit
#   kilter_add_mpi_test(name target nprocs) runs `target` under mpirun with nprocs ranks, label mpi
#   kilter_add_e2e_test(name script)        a bash script given the kilter binary, label e2e
# mpirun gets --allow-run-as-root (CI and these machines run as root) and --oversubscribe (more
# ranks than cores); both are visible here on purpose.
set(KILTER_MPIRUN_FLAGS --allow-run-as-root --oversubscribe --bind-to none
    CACHE STRING "Extra flags for mpirun in tests")
set(KILTER_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with Debian's torch/h5py/numpy for test oracles")

function(kilter_add_unit_test name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE kilter_lib GTest::gtest GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS unit TIMEOUT 300)
endfunction()

function(kilter_add_mpi_test name target nprocs)
  add_test(NAME ${name}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${nprocs} ${KILTER_MPIRUN_FLAGS}
                   $<TARGET_FILE:${target}> ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS ${nprocs}
                       ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
endfunction()

function(kilter_add_e2e_test name script)
  add_test(NAME ${name} COMMAND bash ${script} $<TARGET_FILE:kilter>)
  set_tests_properties(${name} PROPERTIES LABELS e2e TIMEOUT 600
                       ENVIRONMENT "KILTER_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILTER_PYTHON=${KILTER_PYTHON};MPIEXEC=${MPIEXEC_EXECUTABLE};KILTER_MPIRUN_FLAGS=${KILTER_MPIRUN_FLAGS_STR};OPENBLAS_NUM_THREADS=1")
endfunction()
string(REPLACE ";" " " KILTER_MPIRUN_FLAGS_STR "${KILTER_MPIRUN_FLAGS}")

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

# ---- sanitizer builds (cmake/KilterSanitize.cmake, scripts/sanitize.sh) --------------------------
# The thread-heavy tests TSan runs (label `tsan`), in one place: the gradient reducer's
# communication thread, the prefetch reader's workers, the checkpointer's writer thread, the
# watchdog, the diagnostics' gathers, and short training runs where all of them run at once with
# the stop-signal path (preemption, resume).
set(KILTER_TSAN_TESTS
    comm_reducer_np2 comm_reducer_np4_2x2          # communication thread, overlap with backward
    io_reader_test                                 # prefetch workers, consumer helping, shutdown
    checkpoint_guards_test checkpoint_mpi_2        # signals, async checkpoint writer, watchdog
    checkpoint_watchdog_abort_3                    # the watchdog firing across ranks
    diag_statistics_test diag_rank_4               # diagnostics: live watch, step-record gathers
    prep_parquet                                   # Parquet row groups decoded on worker threads
    model_cut_test                                 # models in threads exchanging K/V of cut pieces
    e2e_fault_signal e2e_resume_equality)          # whole runs: stop signal, checkpoint, resume

# Left out of the ASan run (label `no_asan`; .ci/run runs them on the normal build): tests whose
# timings do not hold at -O1 with ASan on 2 cores, and the whole-run numerics comparisons, which
# take 4-7x as long under ASan (263 s of its run) to check figures, not memory: the code they
# run is under ASan in the unit and mpi tests named beside them and in the other e2e runs
# (e2e_fault_kv_exchange trains with cuts; every run of 2+ ranks is sharded by default, and
# e2e_resume_world_size resumes its checkpoints on other world sizes).
set(KILTER_NO_ASAN_TESTS
    e2e_invariance                                 # world sizes agree (comm_reducer_np*)
    e2e_cut_invariance e2e_cut_long_context        # cuts agree (model_cut_test, kv_exchange_np*)
    e2e_shard_optimizer                            # sharded = unsharded (model_optim_test, comm_reducer_np*)
    e2e_shard_group                                # HSDP = 1 rank (comm_reducer_np*'s groups; sharded
                                                   # parameters run under ASan in e2e_shard_parameters)
    e2e_shard_parameters_cut                       # parameters with cut pieces = none (338 s under ASan,
                                                   # 57 s here): the unit gathers run under ASan in
                                                   # e2e_shard_parameters (HSDP, bf16 storage, resume),
                                                   # cut pieces in e2e_fault_kv_exchange, e2e_llama_train,
                                                   # model_cut_test and kv_exchange_np*; the two together
                                                   # and samples under parameters only here
    e2e_cost_calibration                           # the in-run fit and re-plan by a test hook's costs
                                                   # (130 s under ASan, 35 s here): the fit runs under ASan
                                                   # in balance_calibrate_test, balance_window_fit_test and
                                                   # unit_train_cost_calibration, a re-plan mid-run in
                                                   # e2e_cut_cost_check
    e2e_recompute                                  # bit-identical (model_recompute_test)
    e2e_bf16_fortunes                              # 3 x 300 steps of a 260k-parameter model
    e2e_memory_plan                                # peak RSS against the plan: not asserted under ASan,
                                                   # whose shadow memory it would measure (92 s there)
    e2e_memory_plan_rss                            # the same, 4 ranks of a 50 M model by sharding mode
    diag_straggler                                 # a 50 ms drill among 4 ASan-slowed ranks is below
                                                   # the straggler threshold (a share of the step)
    backend_cuda_host_test                         # built only with CUDA (the sanitizer builds have none)
    tokenizer_prep)                                # in-process SentencePiece training passes its 120 s
                                                   # timeout with whole allocation stacks, which its
                                                   # kilter train (MPI) needs; the tokenizers run
                                                   # under ASan in tokenizer_exact_* and unit tests

# Tests that start no MPI process and allocate heavily (the tokenizers): the fast unwinder for
# them. Every other test records whole allocation stacks (fast_unwind_on_malloc=0): the leaks of
# MPI processes come from Open MPI's libraries, built without frame pointers, and only a whole
# stack names the library (tests/sanitizers/lsan.supp); the fast one is garbage past them.
# (mpirun's mca_base_env_list could give whole stacks to ranks only, but Open MPI refuses it
# together with the -x the e2e scripts pass.)
set(KILTER_ASAN_FAST_UNWIND_TESTS
    tokenizer_exact_hf tokenizer_exact_hf-split tokenizer_exact_hf-extras
    tokenizer_exact_sp-bpe tokenizer_exact_sp-unigram)

# Tests that make HDF5 fail to close a file on purpose (storage faults): HDF5 keeps that file's
# state until exit, so their LSan suppressions are tests/sanitizers/lsan-failed-close.supp.
set(KILTER_ASAN_FAILED_CLOSE_TESTS checkpoint_file_test)

# Targets left out of `all` (EXCLUDE_FROM_ALL): scripts/test.sh under KILTER_SKIP_ASAN_TESTED=1
# names the unit and mpi test binaries CI's ASan build compiles and runs, so that its normal build
# does not compile them a second time. Empty by default.
set(KILTER_NOT_BUILT "" CACHE STRING "Targets left out of all (scripts/test.sh, CI's normal build)")

# Called once after every tests/*/*.cmake fragment: labels the TSan and no-ASan selections and,
# in a sanitizer build, gives every test the sanitizers' run-time options (inherited by the ranks
# mpirun starts and by every kilter a script runs) and the report check around them
# (tests/sanitizers/).
function(kilter_finish_tests)
  foreach(test ${KILTER_TSAN_TESTS})
    if(TEST ${test})
      set_property(TEST ${test} APPEND PROPERTY LABELS tsan)
    endif()
  endforeach()
  foreach(test ${KILTER_NO_ASAN_TESTS})
    if(TEST ${test})
      set_property(TEST ${test} APPEND PROPERTY LABELS no_asan)
    endif()
  endforeach()
  foreach(target ${KILTER_NOT_BUILT})
    if(TARGET ${target})
      set_property(TARGET ${target} PROPERTY EXCLUDE_FROM_ALL ON)
    endif()
  endforeach()
  if(NOT KILTER_SANITIZE_KIND)
    return()
  endif()

  set(dir ${CMAKE_SOURCE_DIR}/tests/sanitizers)
  set(reports ${CMAKE_BINARY_DIR}/sanitizer-reports)
  get_property(tests DIRECTORY ${CMAKE_SOURCE_DIR} PROPERTY TESTS)
  foreach(test ${tests})
    # Reports go to files named after the test (reports.sh check lists them), not only to a
    # stderr that a script may swallow. halt_on_error / -fno-sanitize-recover: the first ASan or
    # UBSan report ends the process with a failure; LSan checks for leaks at exit.
    set(log log_path=${reports}/${test})
    if(KILTER_SANITIZE_KIND STREQUAL "asan")
      set(asan detect_leaks=1:halt_on_error=1:check_initialization_order=1:strict_init_order=1:${log})
      if(NOT test IN_LIST KILTER_ASAN_FAST_UNWIND_TESTS)
        set(asan ${asan}:fast_unwind_on_malloc=0)
      endif()
      set(lsan_supp ${dir}/lsan.supp)
      if(test IN_LIST KILTER_ASAN_FAILED_CLOSE_TESTS)
        set(lsan_supp ${dir}/lsan-failed-close.supp)
      endif()
      set(env "ASAN_OPTIONS=${asan}"
              "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:${log}"
              "LSAN_OPTIONS=suppressions=${lsan_supp}:print_suppressions=0")
    else()
      # Every race of a run is reported (halt_on_error=0), and the process then exits with 66.
      set(env "TSAN_OPTIONS=suppressions=${dir}/tsan.supp:print_suppressions=0:halt_on_error=0:exitcode=66:second_deadlock_stack=1:history_size=3:${log}")
    endif()
    set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT ${env})
    set_property(TEST ${test} APPEND PROPERTY FIXTURES_REQUIRED kilter_sanitizer_reports)
  endforeach()
  add_test(NAME sanitizer_reports_clear COMMAND bash ${dir}/reports.sh clear ${reports})
  set_tests_properties(sanitizer_reports_clear PROPERTIES FIXTURES_SETUP kilter_sanitizer_reports)
  add_test(NAME sanitizer_reports_check COMMAND bash ${dir}/reports.sh check ${reports})
  set_tests_properties(sanitizer_reports_check PROPERTIES FIXTURES_CLEANUP kilter_sanitizer_reports)
endfunction()

// Guards of a training run: checks that must agree across ranks before any work starts,
// the config comparison behind "which keys differ" messages, and the fault-injection hook the
// e2e tests use to make one rank fail. Owner: checkpoints.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/comm/kv_schedule.h"

namespace kilter::train {

// Collective (one allgather, or three with config_ini): every rank learns every rank's config
// hash and kilter version. On any mismatch EVERY rank throws kilter::Error with the same message,
// naming the groups of ranks that differ (no rank is left waiting). When `config_ini` (the
// resolved Config::to_ini() text) is given, the message also names the keys that differ.
void check_consistent_across_ranks(MPI_Comm world, uint64_t config_hash, const std::string& version,
                                   const std::string& config_ini = "");

// Keys whose values differ between two resolved INI texts (Config::to_ini()), as lines
// "section.key = A vs B". With only_hashed, keys that Config::hash ignores (output.*, train.steps,
// ...) are left out, so the list explains a hash mismatch.
std::vector<std::string> config_differences(const std::string& ini_a, const std::string& ini_b, bool only_hashed);


// Test hook for the fault e2e tests: when env KILTER_TEST_FAIL_RANK equals `rank` and
// KILTER_TEST_FAIL_STEP equals `step` (the optimizer steps completed, as the trainer passes it),
// fails in the way KILTER_TEST_FAIL_MODE says:
//   error (default)  throws kilter::Error ("injected failure"), as any error on a rank would;
//   exit             the process exits at once with code 3 (no MPI_Abort, like a crash);
//   hang             the rank stops taking part (sleeps forever, outside any collective), so the
//                    other ranks' watchdogs must end the job after comm.timeout_s;
//   sigusr1          the rank raises SIGUSR1 (a preemption at an exact step: the run checkpoints
//                    after this step and exits with kExitPreempted; resume tests use it to stop
//                    a run of train.steps = N early without changing its learning-rate schedule).
//   nonfinite        nothing here; nonfinite_gradient_injected_for_test() then says yes for this
//                    rank and step, and the rank's gradient of that step becomes NaN (its loss
//                    stays finite): a non-finite gradient on one rank only.
//   kv_exit, kv_hang, kv_hang_backward
//                    nothing here; kv_exchange_for_test() below makes the rank fail inside the
//                    K/V exchange of a cut piece.
// Without the variables it does nothing (one getenv on the first call).
void maybe_fail_for_test(int rank, int64_t step);
bool nonfinite_gradient_injected_for_test(int rank, int64_t step);

// The K/V exchange drills (KILTER_TEST_FAIL_MODE kv_exit | kv_hang): on rank
// KILTER_TEST_FAIL_RANK, at step KILTER_TEST_FAIL_STEP or the first later step where that rank
// holds an earlier part of a cut piece, its micro-batch stops inside the exchange right before it
// sends layer n_layer / 2's K/V (the earlier layers' K/V went out): it prints the step, layer and
// pieces, then exits with code 3 (kv_exit, like a crash) or sleeps forever (kv_hang, so the ranks
// holding the later parts must end the job after comm.timeout_s). kv_hang_backward is the mirror:
// at the first such step where the rank holds a LATER part, its backward stops right before it
// sends layer n_layer / 2's dK/dV of that part's prefix, and the rank holding the earlier part must
// end the job after comm.timeout_s. Returns `exchange` unchanged where the drill does not apply.
std::unique_ptr<comm::CutExchange> kv_exchange_for_test(std::unique_ptr<comm::CutExchange> exchange, int rank,
                                                        int64_t step, int n_layer);

}  // namespace kilter::train

// What must be torn down before a job is aborted, registered by whoever holds it: an NCCL
// communicator (lib/comm/nccl_util.cu) registers ncclCommAbort, so that when the watchdog ends a
// stuck job (lib/train/watchdog.cpp) it first aborts every live communicator of this rank. A rank
// whose peer stalled or died inside an NCCL collective then leaves it at once, through
// ncclCommAbort, as the MPI path leaves through MPI_Abort; nothing of it is left spinning on the
// device. Plain C++: it builds without CUDA (no hook is ever registered there).
#pragma once
#include <cstdint>
#include <functional>

namespace kilter::comm {

// Registers `hook`; returns a token for unregister_abort_hook. Thread-safe.
uint64_t register_abort_hook(std::function<void()> hook);
void unregister_abort_hook(uint64_t token);
// Runs every registered hook once, in registration order, and returns how many ran. Called from
// the aborting thread while others may still be inside the operations the hooks end.
int run_abort_hooks();

}  // namespace kilter::comm

// The run's engine probes (lib/backend/engine_probe.h): before the model is made, every engine the
// run would trust untested on this device, driver and cuDNN runs in a child process; the ranks
// agree on the verdicts (an engine is used only where it passed on every node) and the model is
// made with the engines that passed. One probe per node: the node's first rank starts the child,
// the others wait on its verdict file in <run_dir>/engine-probes/<host>/, which later runs on the
// same device, driver and cuDNN reuse.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "lib/backend/engine_probe.h"
#include "lib/comm/communicator.h"
#include "lib/model/model.h"

namespace kilter::train {

struct EngineChoice {
  backend::ProbeVerdict verdict;  // this node's
  bool passed_everywhere = false;
  std::string choice;             // what the run does because of it (log and summary.json)
};

// Collective over `world`. Probes what engine_probe_requests asks for, applies the agreed
// verdicts to `options` and logs each choice (rank 0; a node whose probe failed, its first rank).
// Returns the choices (none where nothing needed probing: the CPU backend, fp32 on cuBLASLt).
// KILTER_PROBE_TIMEOUT_S bounds a child (default 300 s).
std::vector<EngineChoice> probe_engines(MPI_Comm world, const comm::Topology& topo, const std::string& run_dir,
                                        const std::string& backend, const model::ModelSpec& spec,
                                        model::BackendOptions& options);

}  // namespace kilter::train

// run_engine_probes.h: the node's probes, the ranks' agreement, the choices logged.
#include "lib/train/run_engine_probes.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "lib/backend/probed_engines.h"

namespace kilter::train {

namespace {

std::string host_name() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

double probe_timeout_s() {
  const char* text = std::getenv("KILTER_PROBE_TIMEOUT_S");
  const double value = text != nullptr ? std::atof(text) : 0.0;
  return value > 0.0 ? value : 300.0;
}

}  // namespace

std::vector<EngineChoice> probe_engines(MPI_Comm world, const comm::Topology& topo, const std::string& run_dir,
                                        const std::string& backend, const model::ModelSpec& spec,
                                        model::BackendOptions& options) {
  std::vector<EngineChoice> choices;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  const std::optional<backend::ProbeIdentity> identity = backend::engine_probe_identity(backend);
  // Every rank takes part or none: the requests depend only on the configuration, the device on the rank.
  int probing = identity.has_value() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &probing, 1, MPI_INT, MPI_MIN, world);
  if (!probing) return choices;
  const std::string dir = (std::filesystem::path(run_dir) / "engine-probes" / host_name()).string();
  backend::ProbeLauncher launcher;
  launcher.timeout_s = probe_timeout_s();
  std::vector<std::string> done;
  for (;;) {
    const std::vector<backend::ProbeRequest> requests = backend::engine_probe_requests(backend, spec, options, done);
    if (requests.empty()) break;
    for (const backend::ProbeRequest& request : requests) {
      EngineChoice c;
      c.verdict = backend::node_verdict(launcher, request, *identity, dir, topo.local_rank == 0, launcher.timeout_s + 60.0);
      int passed = c.verdict.passed ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &passed, 1, MPI_INT, MPI_MIN, world);
      c.passed_everywhere = passed != 0;
      if (rank == 0 || (topo.local_rank == 0 && !c.verdict.passed))
        std::fprintf(stderr, "kilter: rank %d: %s\n", rank, backend::describe_verdict(c.verdict).c_str());
      c.choice = backend::apply_engine_verdict(options, c.verdict, c.passed_everywhere);
      if (rank == 0) std::fprintf(stderr, "kilter: cuda backend: %s\n", c.choice.c_str());
      done.push_back(request.engine);
      choices.push_back(std::move(c));
    }
  }
  return choices;
}

}  // namespace kilter::train

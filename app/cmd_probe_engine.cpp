// `kilter __probe-engine`: kilter's own subcommand, not in the help. The trainer starts it as a
// child process to run one engine's self-check on the device (lib/backend/engine_probe.h), so that
// a crash there ends the child, not the run. No MPI: the child is a plain process.
#include "app/commands.h"
#include "lib/backend/engine_probe.h"
#include "lib/backend/probed_engines.h"

namespace kilter::app {

int cmd_probe_engine(int argc, char** argv) {
  return backend::probe_child_main(argc - 1, argv + 1, backend::run_engine_probe);
}

}  // namespace kilter::app

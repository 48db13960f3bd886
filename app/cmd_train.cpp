// `kilter train --config FILE [--section.key=value ...] [--resume RUN_DIR|latest] [--json]`:
// options are checked before MPI starts; any error on any rank ends every rank (MPI_Abort).
#include <boost/program_options.hpp>
#include <cstdio>
#include <exception>

#include "app/commands.h"
#include "app/launch.h"
#include "io/error.h"
#include "lib/core/config.h"
#include "lib/train/trainer.h"

namespace po = boost::program_options;

namespace kilter::app {

int cmd_train(int argc, char** argv) {
  Config cfg;
  train::RunOptions opts;
  po::variables_map vm;
  po::options_description extra("Train");
  extra.add_options()
      ("resume", po::value(&opts.resume), "continue RUN_DIR (or 'latest': output.dir) from its newest checkpoint up to train.steps")
      ("json", po::bool_switch(&opts.json), "print the summary object last on rank 0's stdout");
  try {
    if (!parse_command_line(argc, argv,
                            "usage: mpirun -np P kilter train --config FILE [--section.key=value ...] "
                            "[--resume RUN_DIR|latest] [--json]",
                            extra, vm, cfg))
      return 0;
  } catch (const std::exception& e) {
    if (launcher_rank() == 0) std::fprintf(stderr, "kilter train: %s\n", e.what());
    return 2;
  }
  init_mpi(&argc, &argv);
  int rc = 0;
  try {
    rc = train::run_training(MPI_COMM_WORLD, cfg, opts);
  } catch (const std::exception& e) {
    abort_all(MPI_COMM_WORLD, std::string("train failed: ") + e.what());
  }
  MPI_Finalize();
  return rc;
}

}  // namespace kilter::app

// `kilter train --config FILE [--section.key=value ...] [--resume RUN_DIR|latest] [--force] [--json]`:
// options, the dataset's index and the run directory are checked before MPI starts (exit 2);
// any error on any rank after that ends every rank (MPI_Abort).
#include <boost/program_options.hpp>
#include <cstdio>
#include <exception>

#include "app/commands.h"
#include "app/launch.h"
#include "io/base/error.h"
#include "lib/core/config.h"
#include "lib/train/run_dir.h"
#include "lib/train/trainer.h"

namespace po = boost::program_options;

namespace kilter::app {

int cmd_train(int argc, char** argv) {
  Config cfg;
  train::RunOptions opts;
  bool force = false;
  bool print_config = false;
  po::variables_map vm;
  po::options_description extra("Train");
  extra.add_options()
      ("resume", po::value(&opts.resume), "continue RUN_DIR (or 'latest': output.dir) from its newest checkpoint up to train.steps "
                                          "(a re-run into an output.dir with checkpoints of the same config continues by default)")
      ("force", po::bool_switch(&force), "start over in an output.dir that holds a run: the old run is moved to "
                                         "OUTPUT_DIR.old-TIMESTAMP (nothing is deleted)")
      ("json", po::bool_switch(&opts.json), "print the summary object last on rank 0's stdout")
      ("print-config", po::bool_switch(&print_config), "print the config as the run would record it (config.ini: every key, "
                                                       "the value in force) and exit; checks nothing beyond the keys");
  // Everything the config and the dataset's index can tell is checked here, before MPI starts,
  // on every rank alike; only the launcher's rank 0 prints, and every rank exits 2.
  train::RunDirDecision decision;
  try {
    if (!parse_command_line(argc, argv,
                            "usage: mpirun -np P kilter train --config FILE [--section.key=value ...] "
                            "[--resume RUN_DIR|latest] [--force] [--json]\n"
                            "The world size P is the launcher's (mpirun -np, srun -n). Re-running the same command\n"
                            "continues the run in output.dir from its newest checkpoint; another config there is\n"
                            "refused naming the keys that differ; --force moves the old run aside and starts over.",
                            extra, vm, cfg))
      return 0;
    if (print_config) {
      if (launcher_rank() == 0) std::printf("%s", cfg.to_ini().c_str());
      return 0;
    }
    train::check_dataset_before_launch(cfg);
    decision = train::decide_run_dir(cfg, opts.resume, force);
  } catch (const Error& e) {
    if (launcher_rank() == 0) std::fprintf(stderr, "kilter train: %s\n", e.what());
    return refused_before_mpi(e.is_user_error() ? 2 : 1);
  } catch (const std::exception& e) {
    if (launcher_rank() == 0) std::fprintf(stderr, "kilter train: %s\n", e.what());
    return refused_before_mpi(2);
  }
  if (decision.action == train::RunDirDecision::Action::nothing_to_do) {
    if (launcher_rank() == 0) std::fprintf(stderr, "kilter train: %s\n", decision.note.c_str());
    return 0;
  }
  opts.resume = decision.resume_arg;
  opts.move_aside = decision.action == train::RunDirDecision::Action::move_aside;
  opts.note = decision.note;
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

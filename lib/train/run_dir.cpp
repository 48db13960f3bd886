// The run directory's guards at start (see run_dir.h).
#include "lib/train/run_dir.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "io/checkpoint.h"
#include "io/error.h"
#include "lib/train/checkpointer.h"
#include "lib/train/guards.h"

namespace kilter::train {
namespace {

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Rank 0's text reaches every rank (a result, or an error message).
std::string broadcast_from_rank0(MPI_Comm world, std::string text) {
  long long length = (long long)text.size();
  MPI_Bcast(&length, 1, MPI_LONG_LONG, 0, world);
  text.resize(size_t(length));
  if (length > 0) MPI_Bcast(text.data(), int(length), MPI_CHAR, 0, world);
  return text;
}

}  // namespace

std::string find_resume_checkpoint(MPI_Comm world, const std::string& run_dir, const std::string& resume_arg) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::string path, problem;
  if (rank == 0) {
    path = Checkpointer::latest(run_dir);
    if (path.empty()) {
      std::ostringstream os;
      os << "--resume " << resume_arg << ": ";
      const std::string checkpoints = run_dir + "/checkpoints";
      if (!is_directory(run_dir)) {
        os << "the run directory " << run_dir << " does not exist; name the output.dir of the run to continue, "
           << "or start a new run without --resume";
      } else {
        os << "no checkpoint in " << checkpoints << " (no step-NNNNNNNN.h5 file";
        const auto temps = io::stale_temp_files(checkpoints);
        if (!temps.empty()) os << "; only " << temps.front() << ", a write that did not finish";
        os << "); start the run anew without --resume, or name a run directory that has checkpoints "
           << "(a run writes one every output.checkpoint_every steps and when it ends)";
      }
      problem = os.str();
    }
  }
  problem = broadcast_from_rank0(world, problem);
  KILTER_CHECK(problem.empty(), problem);
  return broadcast_from_rank0(world, path);
}

void check_new_run_dir(MPI_Comm world, const std::string& run_dir, const Config& cfg) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::string problem;
  if (rank == 0) {
    const auto checkpoints = io::list_checkpoints(run_dir + "/checkpoints");
    std::ifstream in(run_dir + "/config.ini");
    if (!checkpoints.empty() && in) {
      std::stringstream text;
      text << in.rdbuf();
      const std::vector<std::string> diffs = config_differences(text.str(), cfg.to_ini(), true);
      const std::string& newest = checkpoints.back().second;
      if (!diffs.empty()) {
        std::ostringstream os;
        os << "output.dir " << run_dir << " holds a run of another config (" << checkpoints.size()
           << " checkpoint(s), the newest " << newest << "; " << diffs.size()
           << " key(s) differ); set output.dir to a new folder, continue that run with --resume " << run_dir
           << " --config " << run_dir << "/config.ini, or remove " << run_dir
           << "\n  keys that differ (that run vs now):";
        for (const auto& d : diffs) os << "\n    " << d;
        problem = os.str();
      } else {
        std::fprintf(stderr,
                     "kilter: warning: output.dir %s already holds checkpoints of this config (the newest %s); "
                     "this run starts again at step 0 (to continue that run instead: --resume %s)\n",
                     run_dir.c_str(), newest.c_str(), run_dir.c_str());
      }
    }
  }
  problem = broadcast_from_rank0(world, problem);
  KILTER_CHECK(problem.empty(), problem);
}

}  // namespace kilter::train

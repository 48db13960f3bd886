// The run directory's guards at start (see run_dir.h).
#include "lib/train/run_dir.h"

#include "lib/train/training_data.h"

#include <sys/stat.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "io/checkpoint.h"
#include "io/dataset.h"
#include "io/base/error.h"
#include "lib/train/checkpointer.h"
#include "lib/train/guards.h"
#include "lib/train/training_data.h"

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

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  if (in) text << in.rdbuf();
  return text.str();
}

// Files that hold a run's results: per-rank metrics, train.csv, summary.json ("" when none).
std::string first_result_file(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* name : {"summary.json", "metrics/train.csv"})
    if (fs::file_size(fs::path(run_dir) / name, ec) > 0 && !ec) return (fs::path(run_dir) / name).string();
  for (const auto& entry : fs::directory_iterator(fs::path(run_dir) / "metrics", ec))
    if (entry.is_regular_file() && entry.file_size() > 0) return entry.path().string();
  return "";
}

}  // namespace

void check_dataset_before_launch(Config& cfg) {
  // The datasets a run reads: data.dir, or every directory of a mixture (data.sources).
  std::vector<std::string> dirs;
  if (cfg.data.sources.empty()) {
    KILTER_USER_CHECK(!cfg.data.dir.empty(), "config key data.dir is empty: name a dataset directory "
                                             "(made by kilter prep ... --out DIR), or a mixture with "
                                             "data.sources = DIR:W, DIR:W, ...");
    dirs.push_back(cfg.data.dir);
  } else {
    for (const auto& source : parse_data_sources(cfg.data.sources)) dirs.push_back(source.first);
  }
  uint32_t vocab_size = 0;
  for (const std::string& dir : dirs) {
    const std::string where = cfg.data.sources.empty() ? "config key data.dir = " + dir
                                                        : "config key data.sources: dataset " + dir;
    KILTER_USER_CHECK(is_directory(dir), where << ": no such folder; make the dataset with kilter prep ... --out "
                                                       << dir << ", or fix the path");
    io::DatasetIndex index;
    try {
      index = io::load_index(dir);
    } catch (const Error& e) {
      KILTER_USER_FAIL(where << ": not a usable dataset: " << e.message()
                                     << " (check it with kilter prep validate " << dir << ")");
    }
    KILTER_USER_CHECK(index.num_docs() > 0, where << ": the dataset holds no documents");
    vocab_size = std::max(vocab_size, index.vocab_size);
  }
  if (!cfg.train.init_from.empty())
    KILTER_USER_CHECK(std::filesystem::exists(cfg.train.init_from),
                      "config key train.init_from = " << cfg.train.init_from
                                                      << ": no such file or folder; give a Hugging Face GPT-2 directory "
                                                         "(config.json + model.safetensors) or a kilter checkpoint");
  if (cfg.model.vocab_size == 0) cfg.model.vocab_size = int(vocab_size);
  KILTER_USER_CHECK(uint32_t(cfg.model.vocab_size) >= vocab_size,
                    "config key model.vocab_size = " << cfg.model.vocab_size << " is smaller than the vocabulary of "
                                                     << cfg.data.dir << cfg.data.sources << " (" << vocab_size
                                                     << "); set it to 0 to take the dataset's");
}

RunDirDecision decide_run_dir(const Config& cfg, const std::string& resume_arg, bool force) {
  RunDirDecision d;
  d.run_dir = resume_arg.empty() || resume_arg == "latest" ? cfg.output.dir : resume_arg;
  KILTER_USER_CHECK(!(force && !resume_arg.empty()),
                    "--force and --resume contradict each other: --force moves the run in "
                        << d.run_dir << " aside and starts over, --resume continues it; give one");
  if (!resume_arg.empty()) {  // explicit: checked once MPI is up (find_resume_checkpoint)
    d.action = RunDirDecision::Action::resume;
    d.resume_arg = resume_arg;
    return d;
  }
  if (!is_directory(d.run_dir)) return d;
  const auto checkpoints = io::list_checkpoints(d.run_dir + "/checkpoints");
  const std::string results = first_result_file(d.run_dir);
  if (checkpoints.empty() && results.empty()) return d;  // an empty folder, or a config.ini only
  if (force) {
    d.action = RunDirDecision::Action::move_aside;
    return d;
  }
  const std::string start_over = "--force starts over (it moves " + d.run_dir + " to " + d.run_dir +
                                 ".old-TIMESTAMP; nothing is deleted)";
  KILTER_USER_CHECK(!checkpoints.empty(),
                    "output.dir " << d.run_dir << " holds a run that wrote no checkpoint (" << results
                                  << "), so it cannot continue; " << start_over
                                  << ", or set output.dir to a new folder");
  const std::string& newest = checkpoints.back().second;
  const int64_t newest_step = checkpoints.back().first;
  const std::string old_ini = read_text(d.run_dir + "/config.ini");
  bool same_hash = false;  // the usual case; also covers a config.ini that lacks keys added since
  try {
    same_hash = !old_ini.empty() && config_from_ini_text(old_ini).hash() == cfg.hash();
  } catch (const Error&) {
    // written by another kilter version: the differences below say which keys
  }
  if (!old_ini.empty() && !same_hash) {
    const std::vector<std::string> diffs = config_differences(old_ini, cfg.to_ini(), true);
    if (!diffs.empty()) {
      std::ostringstream os;
      os << "output.dir " << d.run_dir << " holds a run of another config (" << checkpoints.size()
         << " checkpoint(s), the newest " << newest << "; " << diffs.size() << " key(s) differ); " << start_over
         << "; set output.dir to a new folder to keep both; or continue that run with --config " << d.run_dir
         << "/config.ini\n  keys that differ (that run vs now):";
      for (const auto& diff : diffs) os << "\n    " << diff;
      KILTER_USER_FAIL(os.str());
    }
  }
  if (newest_step >= cfg.train.steps) {
    d.action = RunDirDecision::Action::nothing_to_do;
    d.note = "output.dir " + d.run_dir + " already holds this run at step " + std::to_string(newest_step) +
             " (train.steps = " + std::to_string(cfg.train.steps) +
             "): nothing to do; raise train.steps to train on, or " + start_over;
    return d;
  }
  d.action = RunDirDecision::Action::resume;
  d.resume_arg = d.run_dir;
  d.note = "output.dir " + d.run_dir + " holds checkpoints of this config: continuing from " + newest + " (step " +
           std::to_string(newest_step) + "); " + start_over;
  return d;
}

std::string move_run_aside(const std::string& run_dir) {
  namespace fs = std::filesystem;
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  std::string target = run_dir + ".old-" + stamp;
  for (int i = 2; fs::exists(target); ++i) target = run_dir + ".old-" + stamp + "-" + std::to_string(i);
  std::error_code ec;
  fs::rename(run_dir, target, ec);
  KILTER_USER_CHECK(!ec, "--force: cannot move " << run_dir << " aside to " << target << ": " << ec.message()
                                                 << "; move or remove it yourself");
  return target;
}

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
  KILTER_USER_CHECK(problem.empty(), problem);
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
  KILTER_USER_CHECK(problem.empty(), problem);
}

}  // namespace kilter::train

// Checkpoints of a training run (docs/design.md "Run directory"): the state is copied at a
// step boundary (sharded: each rank writes its own slice; docs/checkpoints.md), then written in
// the background as RUN_DIR/checkpoints/step-NNNNNNNN.h5 (temp file, fsync, rename), keeping the
// newest `keep` files. Owner: checkpoints.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/balance/plan.h"
#include "lib/core/config.h"
#include "lib/model/model.h"

namespace kilter::train {

// What a resumed run needs besides the parameters and moments.
struct TrainState {
  int64_t step = 0;                 // optimizer steps completed
  balance::PlanPosition position;   // where the data plan continues
  uint64_t seed = 0;
  uint64_t config_hash = 0;
  double tokens_seen = 0;
  int world_size = 1;               // of the run that wrote it (informational)
  // The charge per earlier token the plan uses since the cut-cost check measured it
  // (data.cut_cost_check); -1: none, the plan derives it.
  double cut_cost_t = -1;
  // The cost models the in-run calibration put in force with their steps (CostCalibration's
  // checkpoint text); "" where none.
  std::string cost_calibration;
};

class Checkpointer {
 public:
  // Collective over `world`; `run_dir` already exists.
  Checkpointer(MPI_Comm world, const std::string& run_dir, int keep, const Config& cfg);
  ~Checkpointer();  // waits for a write in flight

  // The dataset's tokenizer (kind, file bytes, eos_id), recorded in every checkpoint from now on
  // so that `kilter sample` decodes a checkpoint on its own. Not collective.
  void set_tokenizer(const std::string& kind, const std::string& file_bytes, int64_t eos_id);
  // How many training documents start with each id, (id, count) by id: recorded in every
  // checkpoint from now on for unprompted samples (lib/train/sampling.h). Not collective.
  void set_document_starts(std::vector<std::pair<uint32_t, uint64_t>> starts);

  // Collective (every rank calls it at the same step): snapshots the model state and writes it
  // in the background. Returns quickly; a previous write still in flight is waited for first.
  // With a sharded optimizer there is no snapshot: every rank writes the params and moments of its
  // own ranges into the file before returning (pieces of 16 MiB), and rank 0 finishes the file
  // (checksums, fsync, rename) in the background.
  // A checkpoint that fails to write (full disk, quota, ...) removes its temp file and keeps the
  // previous checkpoints. When it is periodic (final_checkpoint false) rank 0 prints a warning
  // naming the cause and the checkpoint that stays the latest, and training goes on (the next
  // interval tries again). When the run ends after it (its last step, a stop signal:
  // final_checkpoint true), wait() fails the run on every rank.
  void save(const model::Model& model, const TrainState& state, bool final_checkpoint = false);
  // Collective: waits for the write in flight; when it was a final checkpoint and failed, every
  // rank throws the same kilter::Error (the cause, the latest checkpoint left, how to resume).
  // Call it before exiting (the destructor also waits, but can only print a failure).
  void wait();

  // What the last save() cost (rank 0; zeros elsewhere): the training thread's share
  // (waiting for the previous write + copying the state) and the writer thread's.
  struct SaveStats {
    std::string path;             // file of the last completed write
    double waited_seconds = 0;    // save() waiting for the previous write to finish
    double snapshot_seconds = 0;  // save() copying params and moments to host buffers (sharded:
                                  // every rank writing its slice)
    double write_seconds = 0;     // writer thread: HDF5 metadata, data, fsync, rename, prune
    size_t bytes = 0;             // tensor bytes of one checkpoint (params + 2 moments)
  };
  SaveStats last_save() const;

  // Newest complete checkpoint in run_dir/checkpoints ("" when none). Also accepts the path of a
  // checkpoint file (returned as is) or of the checkpoints folder itself.
  static std::string latest(const std::string& run_dir);
  // Loads path into model (params + AdamW moments) and returns the state; every rank reads it
  // (or rank 0 reads and broadcasts). Checks the config hash against cfg (cfg.hash() must be the
  // hash the run stores in TrainState::config_hash; keys Config::hash ignores may differ);
  // errors name the file and the problem (truncated, missing tensor, shape mismatch) and, for a
  // config mismatch, the keys that differ. Collective: rank 0 reads and checks the file and
  // broadcasts; every rank throws the same error.
  static TrainState load(MPI_Comm world, const std::string& path, model::Model& model,
                         const Config& cfg);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kilter::train

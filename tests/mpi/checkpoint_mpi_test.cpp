// Checkpointer, cross-rank guards and the watchdog on several ranks (run under mpirun with 2+
// ranks): background save + load broadcast round trip, keep_checkpoints, the same clear error on
// every rank for a truncated file or a config mismatch, mismatched config across ranks naming the
// ranks and keys, and a watchdog that stays quiet when every rank arrives in time.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint.h"
#include "io/base/error.h"
#include "lib/core/config.h"
#include "lib/model/model.h"
#include "lib/train/checkpointer.h"
#include "lib/train/guards.h"
#include "lib/train/watchdog.h"

namespace {

using kilter::Config;
using kilter::train::Checkpointer;
using kilter::train::TrainState;

// A model that only holds state: what the checkpointer touches (layout, params, moments).
// Compute calls are not part of checkpointing and fail loudly if reached.
class HostStateModel : public kilter::model::Model {
  kilter::model::ModelSpec cfg_;       // declared first: the buffers below are sized from layout_
  kilter::model::ParamLayout layout_;

 public:
  explicit HostStateModel(const kilter::model::ModelSpec& cfg)
      : cfg_(cfg), layout_(kilter::model::ParamLayout::build(cfg)),
        params_(layout_.num_params), m_(layout_.num_params), v_(layout_.num_params) {}
  std::string backend_name() const override { return "host-state"; }
  const kilter::model::ModelSpec& config() const override { return cfg_; }
  const kilter::model::ParamLayout& layout() const override { return layout_; }
  void init_params(uint64_t seed) override {
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i] = float((i * 2654435761u + seed) % 1000) * 1e-3f - 0.5f;
      m_[i] = params_[i] * 1e-2f;
      v_[i] = params_[i] * params_[i] * 1e-4f;
    }
  }
  void set_params(const float* host) override { params_.assign(host, host + params_.size()); }
  void get_params(float* host) const override { std::copy(params_.begin(), params_.end(), host); }
  void get_optimizer_state(float* m, float* v) const override {
    std::copy(m_.begin(), m_.end(), m);
    std::copy(v_.begin(), v_.end(), v);
  }
  void set_optimizer_state(const float* m, const float* v) override {
    m_.assign(m, m + m_.size());
    v_.assign(v, v + v_.size());
  }
  double forward_backward(const kilter::model::Batch&, float, const kilter::model::GradReadyFn&) override {
    KILTER_FAIL("HostStateModel does not compute");
  }
  double forward_loss(const kilter::model::Batch&) override { KILTER_FAIL("HostStateModel does not compute"); }
  void zero_grads() override {}
  float* grads() override { return nullptr; }
  float* params() override { return params_.data(); }
  double grad_norm_squared() override { return 0; }
  void adamw_step(const kilter::model::AdamWParams&) override { KILTER_FAIL("HostStateModel does not compute"); }

  std::vector<float> params_, m_, v_;
};

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// A run directory every rank agrees on (rank 0 makes it, broadcasts the name).
std::string shared_temp_dir() {
  char name[256] = {0};
  if (world_rank() == 0) {
    char tmpl[] = "/tmp/kilter-ckpt-mpi.XXXXXX";
    std::snprintf(name, sizeof(name), "%s", ::mkdtemp(tmpl));
  }
  MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, MPI_COMM_WORLD);
  return name;
}

void remove_dir(const std::string& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::system(("rm -rf " + dir).c_str());
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const kilter::Error& e) {
    return e.what();
  }
  return "";
}

Config small_config() {
  Config cfg;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 2;
  cfg.model.n_embd = 8;
  cfg.model.block_size = 16;
  cfg.model.vocab_size = 11;
  return cfg;
}

kilter::model::ModelSpec gpt_of(const Config& c) {
  return {c.model.n_layer, c.model.n_head, c.model.n_embd, c.model.block_size, c.model.vocab_size};
}

TEST(Checkpointer, SaveInBackgroundThenLoadOnEveryRank) {
  const std::string run_dir = shared_temp_dir();
  Config cfg = small_config();
  HostStateModel model(gpt_of(cfg));
  model.init_params(7);
  TrainState state;
  state.seed = cfg.train.seed;
  state.config_hash = cfg.hash();
  {
    Checkpointer ckpt(MPI_COMM_WORLD, run_dir, /*keep=*/2, cfg);
    for (int64_t step : {5, 10, 15}) {
      state.step = step;
      state.position.epoch = uint64_t(step / 10);
      state.position.step_in_epoch = uint64_t(step % 10);
      state.tokens_seen = double(step) * 1000.5;
      ckpt.save(model, state);
      // The snapshot was taken: changing the model now must not change the file being written.
      for (auto& p : model.params_) p += 1.0f;
    }
    ckpt.wait();
    if (world_rank() == 0) {
      auto stats = ckpt.last_save();
      EXPECT_EQ(stats.path, run_dir + "/checkpoints/step-00000015.h5");
      EXPECT_EQ(stats.bytes, 3 * model.layout().num_params * sizeof(float));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto listed = kilter::io::list_checkpoints(run_dir + "/checkpoints");
  ASSERT_EQ(listed.size(), 2u) << "keep_checkpoints = 2";
  EXPECT_EQ(listed[0].first, 10);
  const std::string latest = Checkpointer::latest(run_dir);
  EXPECT_EQ(latest, run_dir + "/checkpoints/step-00000015.h5");
  EXPECT_EQ(Checkpointer::latest(latest), latest);
  EXPECT_EQ(Checkpointer::latest(run_dir + "/checkpoints"), latest);

  // The step-15 snapshot holds the params as they were before the third "+1".
  std::vector<float> expected = model.params_;
  for (auto& p : expected) p -= 1.0f;
  HostStateModel restored(gpt_of(cfg));
  TrainState loaded = Checkpointer::load(MPI_COMM_WORLD, latest, restored, cfg);
  EXPECT_EQ(loaded.step, 15);
  EXPECT_EQ(loaded.position.epoch, 1u);
  EXPECT_EQ(loaded.position.step_in_epoch, 5u);
  EXPECT_EQ(loaded.tokens_seen, 15 * 1000.5);
  EXPECT_EQ(loaded.config_hash, cfg.hash());
  int world_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  EXPECT_EQ(loaded.world_size, world_size);
  for (size_t i = 0; i < expected.size(); ++i) ASSERT_FLOAT_EQ(restored.params_[i], expected[i]) << i;
  EXPECT_EQ(restored.m_, model.m_);
  EXPECT_EQ(restored.v_, model.v_);
  remove_dir(run_dir);
}

// HostStateModel with a sharded optimizer: this rank's moments are only those of its ranges (two
// per rank, of uneven sizes, crossing tensor boundaries; rank r owns pieces r and 2P-1-r of 2P),
// as the CPU backend keeps them after shard_optimizer().
class ShardedHostStateModel : public HostStateModel {
 public:
  ShardedHostStateModel(const kilter::model::ModelSpec& cfg, int rank, int size) : HostStateModel(cfg) {
    const size_t n = layout().num_params, pieces = size_t(2 * size);
    auto bound = [&](size_t k) { return n * k * k / (pieces * pieces); };  // uneven: growing pieces
    for (size_t k : {size_t(rank), pieces - 1 - size_t(rank)}) ranges_.push_back({bound(k), bound(k + 1) - bound(k)});
  }
  bool supports_optimizer_shard() const override { return true; }
  std::vector<kilter::model::ParamRange> optimizer_ranges() const override { return ranges_; }
  void get_optimizer_state(float*, float*) const override { KILTER_FAIL("sharded: use get_optimizer_shard"); }
  void get_optimizer_shard(float* m, float* v, size_t first, size_t count) const override {
    size_t at = 0;  // where the current range starts in the shard's sequence
    for (const auto& r : ranges_) {
      for (size_t i = 0; i < r.count; ++i, ++at) {
        if (at < first || at >= first + count) continue;
        m[at - first] = m_[r.offset + i];
        v[at - first] = v_[r.offset + i];
      }
    }
  }

 private:
  std::vector<kilter::model::ParamRange> ranges_;
};

TEST(Checkpointer, ShardedSaveBySlicesEqualsTheUnshardedFile) {
  // Every rank writes its own ranges into the one file; it must read back (checksums included)
  // exactly as the file of the same state written whole by rank 0.
  int world_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  const std::string sharded_dir = shared_temp_dir(), whole_dir = shared_temp_dir();
  Config cfg = small_config();
  ShardedHostStateModel sharded(gpt_of(cfg), world_rank(), world_size);
  HostStateModel whole(gpt_of(cfg));
  sharded.init_params(11);
  whole.init_params(11);
  TrainState state;
  state.config_hash = cfg.hash();
  {
    Checkpointer a(MPI_COMM_WORLD, sharded_dir, 2, cfg), b(MPI_COMM_WORLD, whole_dir, 2, cfg);
    for (int64_t step : {3, 6}) {
      state.step = step;
      a.save(sharded, state);
      b.save(whole, state);
      // Written by slices before save() returns: changing the state now does not change the file.
      for (auto* model : {static_cast<HostStateModel*>(&sharded), &whole})
        for (size_t i = 0; i < model->params_.size(); ++i) {
          model->params_[i] += 0.25f;
          model->m_[i] *= 2.0f;
          model->v_[i] *= 3.0f;
        }
    }
    a.wait();
    b.wait();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (const std::string& name : {std::string("step-00000003.h5"), std::string("step-00000006.h5")}) {
    HostStateModel from_slices(gpt_of(cfg)), from_whole(gpt_of(cfg));
    Checkpointer::load(MPI_COMM_WORLD, sharded_dir + "/checkpoints/" + name, from_slices, cfg);
    Checkpointer::load(MPI_COMM_WORLD, whole_dir + "/checkpoints/" + name, from_whole, cfg);
    EXPECT_EQ(from_slices.params_, from_whole.params_) << name;
    EXPECT_EQ(from_slices.m_, from_whole.m_) << name;
    EXPECT_EQ(from_slices.v_, from_whole.v_) << name;
  }
  if (world_rank() == 0) {
    EXPECT_TRUE(kilter::io::stale_temp_files(sharded_dir + "/checkpoints").empty());
  }
  remove_dir(sharded_dir);
  remove_dir(whole_dir);
}

TEST(Checkpointer, BadFilesAndMismatchesAreTheSameErrorOnEveryRank) {
  const std::string run_dir = shared_temp_dir();
  Config cfg = small_config();
  HostStateModel model(gpt_of(cfg));
  model.init_params(3);
  TrainState state;
  state.step = 4;
  state.config_hash = cfg.hash();
  {
    Checkpointer ckpt(MPI_COMM_WORLD, run_dir, 3, cfg);
    ckpt.save(model, state);
    ckpt.wait();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string path = Checkpointer::latest(run_dir);
  ASSERT_FALSE(path.empty());

  // Another learning rate: refused, naming the key; an allowed change (steps, output) is fine.
  Config other_lr = cfg;
  other_lr.train.lr = 0.5;
  HostStateModel target(gpt_of(cfg));
  std::string err = error_of([&] { Checkpointer::load(MPI_COMM_WORLD, path, target, other_lr); });
  EXPECT_NE(err.find("different config"), std::string::npos) << err;
  EXPECT_NE(err.find("train.lr = "), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
  Config longer = cfg;
  longer.train.steps = 999;
  longer.output.dir = "/elsewhere";
  EXPECT_NO_THROW(Checkpointer::load(MPI_COMM_WORLD, path, target, longer));

  // Another model shape.
  Config wider = cfg;
  wider.model.n_embd = 16;
  HostStateModel wide(gpt_of(wider));
  err = error_of([&] { Checkpointer::load(MPI_COMM_WORLD, path, wide, wider); });
  EXPECT_NE(err.find("n_embd=8"), std::string::npos) << err;
  EXPECT_NE(err.find("n_embd=16"), std::string::npos) << err;

  // Truncated.
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) ASSERT_EQ(::truncate(path.c_str(), 1000), 0);
  MPI_Barrier(MPI_COMM_WORLD);
  err = error_of([&] { Checkpointer::load(MPI_COMM_WORLD, path, target, cfg); });
  EXPECT_NE(err.find("truncated or corrupt"), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
  if (world_rank() != 0) EXPECT_NE(err.find("failed on rank 0"), std::string::npos) << err;
  remove_dir(run_dir);
}

TEST(Guards, AgreementPassesAndMismatchNamesRanksAndKeys) {
  Config cfg = small_config();
  EXPECT_NO_THROW(kilter::train::check_consistent_across_ranks(MPI_COMM_WORLD, cfg.hash(), "0.1.0", cfg.to_ini()));
  EXPECT_NO_THROW(kilter::train::check_consistent_across_ranks(MPI_COMM_WORLD, cfg.hash(), "0.1.0"));

  Config mine = cfg;
  if (world_rank() == 1) mine.train.lr = 0.01;
  std::string err = error_of([&] {
    kilter::train::check_consistent_across_ranks(MPI_COMM_WORLD, mine.hash(), "0.1.0", mine.to_ini());
  });
  EXPECT_NE(err.find("ranks disagree on the configuration"), std::string::npos) << err;
  EXPECT_NE(err.find(": ranks 1"), std::string::npos) << err;
  EXPECT_NE(err.find("train.lr = "), std::string::npos) << err;
  EXPECT_NE(err.find(" vs 0.01"), std::string::npos) << err;

  err = error_of([&] {
    kilter::train::check_consistent_across_ranks(MPI_COMM_WORLD, cfg.hash(), world_rank() == 0 ? "0.1.0" : "0.2.0");
  });
  EXPECT_NE(err.find("kilter version 0.2.0: ranks 1"), std::string::npos) << err;
}

TEST(Watchdog, QuietWhenEveryRankArrivesInTime) {
  kilter::train::Watchdog watchdog(MPI_COMM_WORLD, 3.0);
  for (long step = 0; step < 5; ++step) {
    if (world_rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    watchdog.enter("test barrier", step);
    MPI_Barrier(MPI_COMM_WORLD);
    watchdog.leave();
  }
  SUCCEED();  // an abort would have ended the process
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  kilter::set_error_rank(world_rank());
  ::testing::InitGoogleTest(&argc, argv);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = 1;
  if (size < 2) {
    std::fprintf(stderr, "checkpoint_mpi_test needs at least 2 ranks\n");
  } else {
    rc = RUN_ALL_TESTS();
  }
  // Every rank's verdict decides the exit code of every rank.
  MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}

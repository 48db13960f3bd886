// The command line without MPI (issue 25): exact option names (no prefix guessing), the nearest
// name suggested for a near miss, the two kinds of errors (a user's mistake prints without the
// source place, an internal failure keeps it), defaults printed in their shortest round-trip
// form, and metrics/train.csv rows read back as written.
#include <gtest/gtest.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "io/did_you_mean.h"
#include "io/base/error.h"
#include "lib/core/config.h"
#include "lib/diag/metrics_csv.h"
#include "lib/diag/report.h"

namespace po = boost::program_options;
using kilter::Config;

namespace {

// Runs parse_command_line on "train ARGS..." and returns the error's message ("" when none).
std::string parse_error(std::vector<std::string> args) {
  args.insert(args.begin(), "train");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  Config cfg;
  po::options_description extra("Train");
  std::string resume;
  extra.add_options()("resume", po::value(&resume), "resume");
  po::variables_map vm;
  try {
    kilter::parse_command_line(int(argv.size()), argv.data(), "usage", extra, vm, cfg);
  } catch (const kilter::Error& e) {
    EXPECT_TRUE(e.is_user_error()) << e.what();
    return e.what();
  }
  return "";
}

}  // namespace

TEST(DidYouMean, EditDistance) {
  EXPECT_EQ(kilter::edit_distance("trian", "train"), 1u);  // a swap of neighbours
  EXPECT_EQ(kilter::edit_distance("step", "steps"), 1u);
  EXPECT_EQ(kilter::edit_distance("", "abc"), 3u);
  EXPECT_EQ(kilter::edit_distance("kitten", "sitting"), 3u);
}

TEST(DidYouMean, NearestNamePrefixAndSection) {
  const std::vector<std::string> commands = {"prep", "plan", "train", "sample", "report"};
  EXPECT_EQ(kilter::did_you_mean("trian", commands), "train");
  EXPECT_EQ(kilter::did_you_mean("reprot", commands), "report");
  EXPECT_EQ(kilter::did_you_mean("xyzzy", commands), "");
  EXPECT_EQ(kilter::did_you_mean("world", {"world-size", "json"}), "world-size");
  EXPECT_EQ(kilter::did_you_mean("train.max_tokens", {"data.max_tokens", "train.steps"}), "data.max_tokens");
}

TEST(ExactOptions, PrefixesAreRefusedWithASuggestion) {
  EXPECT_EQ(parse_error({"--train.steps=5"}), "");
  const std::string step = parse_error({"--train.step=0"});
  EXPECT_NE(step.find("unknown option --train.step; did you mean --train.steps?"), std::string::npos) << step;
  const std::string res = parse_error({"--res", "x"});
  EXPECT_NE(res.find("unknown option --res; did you mean --resume?"), std::string::npos) << res;
  const std::string lr = parse_error({"--train.learning_rate=1e-3"});
  EXPECT_NE(lr.find("did you mean --train.lr?"), std::string::npos) << lr;
  const std::string world = parse_error({"--world-size", "4"});
  EXPECT_NE(world.find("the launcher sets the world size"), std::string::npos) << world;
  EXPECT_NE(world.find("mpirun -np 4"), std::string::npos) << world;
}

TEST(ExactOptions, BadEnumValueAndCrossKeyChecks) {
  const std::string backend = parse_error({"--train.backend=cdua"});
  EXPECT_NE(backend.find("config key train.backend = 'cdua': expected auto | cpu | cuda; did you mean cuda?"),
            std::string::npos)
      << backend;
  const std::string eval = parse_error({"--train.eval_every=10"});
  EXPECT_NE(eval.find("train.eval_every = 10: needs held-out documents"), std::string::npos) << eval;
  EXPECT_EQ(parse_error({"--train.eval_every=10", "--data.eval_fraction=0.1"}), "");
}

TEST(ConfigFile, UnknownKeySuggestsTheKilterName) {
  try {
    kilter::config_from_ini_text("[train]\nmax_iters = 5\n");
    FAIL() << "max_iters was accepted";
  } catch (const kilter::Error& e) {
    EXPECT_TRUE(e.is_user_error());
    EXPECT_NE(std::string(e.what()).find("unknown key train.max_iters; did you mean train.steps ([train] steps)?"),
              std::string::npos)
        << e.what();
  }
}

TEST(Errors, UserErrorsHaveNoSourcePlaceInternalOnesDo) {
  try {
    KILTER_USER_FAIL("config key x = 1: must be 2");
  } catch (const kilter::Error& e) {
    EXPECT_TRUE(e.is_user_error());
    EXPECT_EQ(std::string(e.what()), "config key x = 1: must be 2");
    EXPECT_EQ(e.message(), "config key x = 1: must be 2");
  }
  try {
    KILTER_FAIL("H5Dread failed");
  } catch (const kilter::Error& e) {
    EXPECT_FALSE(e.is_user_error());
    const std::string what = e.what();
    EXPECT_NE(what.find("H5Dread failed ["), std::string::npos) << what;
    EXPECT_NE(what.find("cli_test.cpp:"), std::string::npos) << what;
  }
}

TEST(Defaults, ShortestRoundTripInHelpAndIni) {
  Config cfg;
  const std::string ini = cfg.to_ini();
  EXPECT_NE(ini.find("lr = 0.0003\n"), std::string::npos) << ini;
  EXPECT_NE(ini.find("eps = 1e-08\n"), std::string::npos) << ini;
  EXPECT_EQ(ini.find("0000000"), std::string::npos) << ini;  // no float noise anywhere
  cfg.train.lr = 0.1 + 0.2;  // 0.30000000000000004 must survive the trip exactly
  const Config back = kilter::config_from_ini_text(cfg.to_ini());
  EXPECT_EQ(back.train.lr, cfg.train.lr);
  EXPECT_EQ(back.hash(), cfg.hash());
}

TEST(TrainCsv, RowsReadBackAndLaterStepWins) {
  const std::string path = testing::TempDir() + "/train_csv_test.csv";
  std::remove(path.c_str());
  {
    kilter::diag::CsvAppender file(path, kilter::diag::train_csv_header(), false);
    kilter::diag::TrainRow r;
    r.step = 1, r.tokens = 1000, r.loss = 4.5, r.lr = 3e-4, r.grad_norm = 0.5, r.tokens_per_second = 100;
    file.append_line(kilter::diag::train_csv_row(r));
    r.step = 2, r.tokens = 2000, r.eval_loss = std::log(50.0);
    file.append_line(kilter::diag::train_csv_row(r));
  }
  {  // a resumed run appends step 2 again; a new run may not truncate the file
    EXPECT_THROW(kilter::diag::CsvAppender(path, kilter::diag::train_csv_header(), false), kilter::Error);
    kilter::diag::CsvAppender file(path, kilter::diag::train_csv_header(), true);
    kilter::diag::TrainRow r;
    r.step = 2, r.tokens = 2000, r.loss = 4.25;
    file.append_line(kilter::diag::train_csv_row(r));
  }
  const auto rows = kilter::diag::read_train_csv(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_DOUBLE_EQ(rows[0].loss, 4.5);
  EXPECT_TRUE(std::isnan(rows[0].eval_loss));
  EXPECT_DOUBLE_EQ(rows[1].loss, 4.25);
  std::ifstream in(path);
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header, "step,tokens,loss,lr,grad_norm,tokens_per_second,eval_loss,eval_perplexity,elapsed_seconds");
}

TEST(Report, StallsBetweenStepsNameTheirCause) {
  kilter::diag::RunData run;
  run.eval_every = 50;
  run.checkpoint_every = 100;
  EXPECT_EQ(kilter::diag::stall_cause(run, 50, "outside"), "evaluation (train.eval_every = 50)");
  EXPECT_EQ(kilter::diag::stall_cause(run, 100, "outside"),
            "evaluation (train.eval_every = 50) + checkpoint (output.checkpoint_every = 100)");
  EXPECT_EQ(kilter::diag::stall_cause(run, 51, "outside"), "");
  EXPECT_EQ(kilter::diag::stall_cause(run, 50, "forward"), "");  // grown inside the step: not ours
}

// train.shard and its old alias train.shard_optimizer: the alias sets shard where shard is left
// at its default, a contradiction is refused naming both keys, and the resolved pair reads back.
TEST(ShardKeys, AliasResolvesAndContradictionIsRefused) {
  const Config none = kilter::config_from_ini_text("[train]\nshard_optimizer = false\n");
  EXPECT_EQ(none.train.shard, "none");
  const Config params = kilter::config_from_ini_text("[train]\nshard = parameters\n");
  EXPECT_TRUE(params.train.shard_optimizer);
  const Config back = kilter::config_from_ini_text(params.to_ini());
  EXPECT_EQ(back.train.shard, "parameters");
  EXPECT_EQ(parse_error({"--train.shard=optimizer", "--train.shard_optimizer=true"}), "");
  const std::string contra = parse_error({"--train.shard=parameters", "--train.shard_optimizer=false"});
  EXPECT_NE(contra.find("train.shard = parameters and train.shard_optimizer = false contradict"), std::string::npos)
      << contra;
  const std::string bad = parse_error({"--train.shard=zero3"});
  EXPECT_NE(bad.find("config key train.shard = 'zero3': expected none | optimizer | parameters"), std::string::npos)
      << bad;
  const std::string group = parse_error({"--train.shard_group=0"});
  EXPECT_NE(group.find("config key train.shard_group = '0'"), std::string::npos) << group;
  EXPECT_EQ(parse_error({"--train.shard_group=2", "--train.grad_dtype=bf16"}), "");
  EXPECT_NE(parse_error({"--train.grad_dtype=fp16"}).find("train.grad_dtype"), std::string::npos);
}

// Sharding never counts in the hash (a checkpoint resumes under any mode), and the new keys at
// their defaults leave the hash of a config written before they existed unchanged.
TEST(ShardKeys, NeverInTheHash) {
  const Config base;
  for (const char* mode : {"none", "optimizer", "parameters"}) {
    Config c;
    c.train.shard = mode;
    c.train.shard_optimizer = std::string(mode) != "none";
    c.train.shard_group = "2";
    c.train.grad_dtype = "bf16";
    c.train.reshard_after_forward = false;
    EXPECT_EQ(c.hash(), base.hash()) << mode;
  }
  std::string old_ini = base.to_ini();
  for (const char* line : {"shard = optimizer\n", "shard_group = world\n", "grad_dtype = auto\n",
                           "reshard_after_forward = 1\n"}) {
    const size_t at = old_ini.find(line);
    ASSERT_NE(at, std::string::npos) << line;
    old_ini.erase(at, std::string(line).size());
  }
  EXPECT_EQ(kilter::config_from_ini_text(old_ini).hash(), base.hash());
}

TEST(ShardKeys, GroupSizeDividesTheWorld) {
  kilter::TrainConfig t;
  EXPECT_EQ(kilter::shard_group_size(t, 4, 2), 4);
  t.shard_group = "node";
  EXPECT_EQ(kilter::shard_group_size(t, 4, 2), 2);
  t.shard_group = "2";
  EXPECT_EQ(kilter::shard_group_size(t, 4, 2), 2);
  t.shard_group = "3";
  try {
    kilter::shard_group_size(t, 4, 2);
    ADD_FAILURE() << "a group of 3 on 4 ranks was accepted";
  } catch (const kilter::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.shard_group = 3: a shard group of 3 ranks does not divide the world size 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(kilter::resolved_grad_dtype(kilter::TrainConfig(), true), "bf16");
  EXPECT_EQ(kilter::resolved_grad_dtype(kilter::TrainConfig(), false), "fp32");
}

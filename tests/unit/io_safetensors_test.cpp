// io/export (issue 26): safetensors written and read back, bf16 rounding, damaged files refused
// naming the file; the HF GPT-2 directory (Conv1D transposes, config checks) and train.init_from's
// refusals (shape, layers, vocabulary) with the names a user acts on.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "io/export/hf_gpt2.h"
#include "io/export/safetensors.h"
#include "lib/train/hf_interop.h"
#include "tests/unit/io_testing.h"

namespace kilter::io {
namespace {

using testing::error_message;
using testing::read_file;
using testing::ScratchDir;
using testing::write_file;

TEST(Safetensors, WritesAndReadsBackF32Exactly) {
  ScratchDir s;
  const std::vector<float> a = {1.5f, -2.25f, 3e-8f, 1e30f, 0.f, -0.f};
  const std::vector<float> b = {7.f, 8.f, 9.f};
  write_safetensors(s.path("m.safetensors"), {{"a", {2, 3}, a.data()}, {"b", {3}, b.data()}}, "F32", {{"format", "pt"}});
  const std::string bytes = read_file(s.path("m.safetensors"));
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  EXPECT_EQ(header % 8, 0u);  // the data section starts 8-byte aligned
  EXPECT_EQ(bytes.size(), 8 + header + 4 * (a.size() + b.size()));
  const auto t = read_safetensors(s.path("m.safetensors"));
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t.at("a").dtype, "F32");
  EXPECT_EQ(t.at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.at("a").values, a);
  EXPECT_EQ(t.at("b").values, b);
}

TEST(Safetensors, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  ScratchDir s;
  const std::vector<float> v = {0.1f, -3.3f, 1234.5f};
  write_safetensors(s.path("h.safetensors"), {{"v", {3}, v.data()}}, "BF16");
  const auto t = read_safetensors(s.path("h.safetensors"));
  EXPECT_EQ(t.at("v").dtype, "BF16");
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(t.at("v").values[i], bf16_to_float(float_to_bf16(v[i])));
}

TEST(Safetensors, DamagedFilesAreRefusedNamingTheFile) {
  ScratchDir s;
  const std::vector<float> a = {1, 2, 3, 4};
  const std::string good = s.path("good.safetensors");
  write_safetensors(good, {{"a", {4}, a.data()}}, "F32");
  const std::string bytes = read_file(good);

  const std::string truncated = s.path("truncated.safetensors");
  write_file(truncated, bytes.substr(0, bytes.size() - 3));
  std::string e = error_message([&] { read_safetensors(truncated); });
  EXPECT_NE(e.find(truncated), std::string::npos) << e;
  EXPECT_NE(e.find("tensor a"), std::string::npos) << e;

  const std::string huge_header = s.path("header.safetensors");
  std::string bad = bytes;
  bad[7] = '\x40';
  write_file(huge_header, bad);
  e = error_message([&] { read_safetensors(huge_header); });
  EXPECT_NE(e.find("header length"), std::string::npos) << e;

  const std::string not_json = s.path("json.safetensors");
  bad = bytes;
  bad[8] = '[';
  bad[9] = '[';
  write_file(not_json, bad);
  EXPECT_NE(error_message([&] { read_safetensors(not_json); }).find("not JSON"), std::string::npos);

  const std::string tiny = s.path("tiny.safetensors");
  write_file(tiny, "abc");
  EXPECT_NE(error_message([&] { read_safetensors(tiny); }).find("not a safetensors file"), std::string::npos);
}

// A tiny model as kilter lays it out, with distinct values everywhere.
struct TinyModel {
  model::ModelSpec gpt{2, 2, 8, 16, 11};
  model::ParamLayout layout = model::ParamLayout::build(gpt);
  std::vector<float> params;
  CheckpointInfo info;
  TinyModel() {
    params.resize(layout.num_params);
    for (size_t i = 0; i < params.size(); ++i) params[i] = float(i % 97) * 0.01f - 0.3f;
    info.n_layer = gpt.n_layer, info.n_head = gpt.n_head, info.n_embd = gpt.n_embd;
    info.block_size = gpt.block_size, info.vocab_size = gpt.vocab_size, info.eos_id = 10;
  }
};

TEST(HfGpt2, ExportTransposesConv1DAndReadsBackExactly) {
  ScratchDir s;
  TinyModel m;
  const auto files = train::write_hf_model(s.path("hf"), m.info, m.layout, m.params.data(), {});
  EXPECT_EQ(files.size(), 3u);  // no tokenizer files for a dataset without one
  const auto raw = read_safetensors(s.path("hf/model.safetensors"));
  const model::ParamTensor& c_fc = m.layout.find("transformer.h.1.mlp.c_fc.weight");  // [4C, C] in kilter
  ASSERT_EQ(raw.at(c_fc.name).shape, (std::vector<int64_t>{8, 32}));                 // [C, 4C] in HF
  EXPECT_EQ(raw.at(c_fc.name).values[1], m.params[c_fc.offset + 8]);                  // (in 0, out 1) = kilter (1, 0)
  const nlohmann::json config = nlohmann::json::parse(read_file(s.path("hf/config.json")));
  EXPECT_EQ(config["activation_function"], "gelu_new");
  EXPECT_EQ(config["n_positions"], 16);
  EXPECT_EQ(config["eos_token_id"], 10);

  const HfGpt2 back = read_hf_gpt2(s.path("hf"));
  EXPECT_EQ(back.shape.n_layer, 2);
  for (const model::ParamTensor& t : m.layout.tensors) {
    ASSERT_EQ(back.shapes.at(t.name), t.shape) << t.name;
    EXPECT_TRUE(std::equal(back.values.at(t.name).begin(), back.values.at(t.name).end(), m.params.begin() + long(t.offset)))
        << t.name;
  }
  // An existing non-empty directory is not overwritten without force.
  EXPECT_NE(error_message([&] { train::write_hf_model(s.path("hf"), m.info, m.layout, m.params.data(), {}); }).find("--force"),
            std::string::npos);
}

TEST(HfGpt2, ConfigsKilterCannotComputeAreRefused) {
  ScratchDir s;
  TinyModel m;
  train::write_hf_model(s.path("hf"), m.info, m.layout, m.params.data(), {});
  nlohmann::json config = nlohmann::json::parse(read_file(s.path("hf/config.json")));
  config["activation_function"] = "relu";
  write_file(s.path("hf/config.json"), config.dump());
  EXPECT_NE(error_message([&] { read_hf_gpt2(s.path("hf")); }).find("activation_function"), std::string::npos);
  config["activation_function"] = "gelu_new";
  config["tie_word_embeddings"] = false;
  write_file(s.path("hf/config.json"), config.dump());
  EXPECT_NE(error_message([&] { read_hf_gpt2(s.path("hf")); }).find("tie_word_embeddings"), std::string::npos);
}

TEST(InitFrom, RefusalsNameTheTensorShapesAndKey) {
  ScratchDir s;
  TinyModel m;
  train::write_hf_model(s.path("hf"), m.info, m.layout, m.params.data(), {});
  const std::vector<float> init(m.layout.num_params, 0.5f);
  std::string note;
  const train::RunVocabulary vocab{"data", "synthetic", "", 11};
  const std::vector<float> loaded =
      train::read_initial_weights(s.path("hf"), m.gpt, m.layout, vocab, "strict", init, note);
  EXPECT_EQ(loaded, m.params);
  EXPECT_NE(note.find("optimizer state and data position start fresh"), std::string::npos) << note;

  model::ModelSpec wider = m.gpt;
  wider.block_size = 32;
  const model::ParamLayout wider_layout = model::ParamLayout::build(wider);
  std::string e = error_message([&] {
    train::read_initial_weights(s.path("hf"), wider, wider_layout, vocab, "strict",
                                std::vector<float>(wider_layout.num_params), note);
  });
  EXPECT_NE(e.find("transformer.wpe.weight is [16, 8] there and [32, 8] in the model"), std::string::npos) << e;
  EXPECT_NE(e.find("model.block_size = 16"), std::string::npos) << e;

  model::ModelSpec deeper = m.gpt;
  deeper.n_layer = 3;
  const model::ParamLayout deeper_layout = model::ParamLayout::build(deeper);
  e = error_message([&] {
    train::read_initial_weights(s.path("hf"), deeper, deeper_layout, vocab, "strict",
                                std::vector<float>(deeper_layout.num_params), note);
  });
  EXPECT_NE(e.find("model.n_layer = 2"), std::string::npos) << e;

  // A vocabulary other than the dataset's: refused, or resized on request.
  model::ModelSpec bigger = m.gpt;
  bigger.vocab_size = 13;
  const model::ParamLayout bigger_layout = model::ParamLayout::build(bigger);
  const train::RunVocabulary bigger_vocab{"data", "synthetic", "", 13};
  e = error_message([&] {
    train::read_initial_weights(s.path("hf"), bigger, bigger_layout, bigger_vocab, "strict",
                                std::vector<float>(bigger_layout.num_params), note);
  });
  EXPECT_NE(e.find("11 ids, the model's 13"), std::string::npos) << e;
  EXPECT_NE(e.find("train.init_vocab = resize"), std::string::npos) << e;
  const std::vector<float> bigger_init(bigger_layout.num_params, 0.5f);
  const std::vector<float> resized = train::read_initial_weights(s.path("hf"), bigger, bigger_layout, bigger_vocab,
                                                                 "resize", bigger_init, note);
  EXPECT_EQ(resized[0], m.params[0]);
  EXPECT_EQ(resized[11 * 8 - 1], m.params[11 * 8 - 1]);  // the last row the source has
  EXPECT_EQ(resized[11 * 8], 0.5f);                      // a new row keeps the model's init
  const model::ParamTensor& wpe = bigger_layout.find("transformer.wpe.weight");
  EXPECT_EQ(resized[wpe.offset], m.params[m.layout.find("transformer.wpe.weight").offset]);

  e = error_message([&] {
    train::read_initial_weights(s.path("nothing"), m.gpt, m.layout, vocab, "strict", init, note);
  });
  EXPECT_NE(e.find("neither a Hugging Face GPT-2 directory"), std::string::npos) << e;
}

}  // namespace
}  // namespace kilter::io

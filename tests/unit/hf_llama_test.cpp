// Hugging Face Llama in and out (issue 38), without transformers: what `kilter export --format
// hf` writes for model.arch = llama (LlamaForCausalLM, Qwen2ForCausalLM with q/k/v biases; the
// config's fields, HF's tensor names, no lm_head.weight when tied), train.init_from reading it
// back bit for bit (fp32 and bf16), and the refusals that name the config field and the model.*
// key: keys that differ from the run's, what kilter does not compute (RoPE scalings other than
// llama3, head_dim, hidden_act, mlp_bias, a short sliding window, a non-zero o_proj bias).
// The parity with transformers itself is tests/e2e/llama_parity.sh's and hf_llama_*.sh's.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "io/export/hf_directory.h"
#include "io/export/safetensors.h"
#include "lib/train/checkpoint_model.h"
#include "lib/train/hf_interop.h"
#include "tests/unit/io_testing.h"
#include "tests/unit/model_testing.h"

namespace kilter::train {
namespace {

using io::testing::ScratchDir;
using io::testing::user_error_message;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const std::string& path, const nlohmann::json& value) { std::ofstream(path) << value.dump(); }

// A tiny llama with distinct values everywhere, as a checkpoint would record it.
struct TinyLlama {
  model::ModelSpec spec;
  model::ParamLayout layout;
  std::vector<float> params;
  io::CheckpointInfo info;
  explicit TinyLlama(const std::function<void(model::ModelSpec&)>& adjust = {}) {
    spec = model::testing::tiny_llama_config(16, 11);
    if (adjust) adjust(spec);
    layout = model::ParamLayout::build(spec);
    params.resize(layout.num_params);
    for (size_t i = 0; i < params.size(); ++i) params[i] = float(i % 101) * 0.01f - 0.5f;
    set_model_keys(info, spec);
    info.eos_id = 10;
  }
  std::string export_to(const std::string& dir, const std::string& dtype = "fp32") const {
    io::HfExportOptions options;
    options.dtype = dtype;
    write_hf_model(dir, info, layout, params.data(), options);
    return dir;
  }
  // train.init_from = dir into a run whose model is `run` (this model's unless given).
  std::vector<float> load(const std::string& dir, const model::ModelSpec* run = nullptr) const {
    const model::ModelSpec& s = run ? *run : spec;
    const model::ParamLayout l = model::ParamLayout::build(s);
    std::string note;
    return read_initial_weights(dir, s, l, RunVocabulary{"data", "synthetic", "", s.vocab_size}, "strict",
                                std::vector<float>(l.num_params, 0.25f), note);
  }
};

TEST(HfLlama, ExportWritesLlamaForCausalLMUnderHfNames) {
  ScratchDir s;
  const TinyLlama m;
  m.export_to(s.path("hf"));
  const nlohmann::json config = read_json(s.path("hf/config.json"));
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["hidden_size"], 16);
  EXPECT_EQ(config["intermediate_size"], 24);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["max_position_embeddings"], 16);
  EXPECT_EQ(config["rms_norm_eps"], 1e-5);
  EXPECT_EQ(config["rope_theta"], 10000.0);
  EXPECT_TRUE(config["rope_scaling"].is_null());
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["attention_bias"], false);
  EXPECT_EQ(config["hidden_act"], "silu");
  EXPECT_EQ(config["eos_token_id"], 10);
  EXPECT_EQ(config["torch_dtype"], "float32");

  const auto stored = io::read_safetensors(s.path("hf/model.safetensors"));
  ASSERT_EQ(stored.size(), m.layout.tensors.size());
  for (const model::ParamTensor& t : m.layout.tensors) {
    ASSERT_TRUE(stored.count(t.name)) << t.name;
    EXPECT_EQ(stored.at(t.name).shape, t.shape) << t.name;  // [out, in] like torch.nn.Linear: no transposes
    EXPECT_TRUE(std::equal(stored.at(t.name).values.begin(), stored.at(t.name).values.end(),
                           m.params.begin() + long(t.offset)))
        << t.name;
  }
  EXPECT_TRUE(stored.count("lm_head.weight"));
  EXPECT_EQ(m.load(s.path("hf")), m.params);  // and back, bit for bit
}

TEST(HfLlama, TiedBiasedAndScaledModels) {
  ScratchDir s;
  const TinyLlama tied([](model::ModelSpec& spec) {
    spec.tie_embeddings = "true";
    spec.rope_scaling = "llama3";
    spec.rope_factor = 32;
    spec.rope_original_context = 8;
  });
  tied.export_to(s.path("tied"));
  EXPECT_FALSE(io::read_safetensors(s.path("tied/model.safetensors")).count("lm_head.weight"));  // HF ties it
  const nlohmann::json config = read_json(s.path("tied/config.json"));
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(config["rope_scaling"]["factor"], 32.0);
  EXPECT_EQ(config["rope_scaling"]["low_freq_factor"], 1.0);
  EXPECT_EQ(config["rope_scaling"]["high_freq_factor"], 4.0);
  EXPECT_EQ(config["rope_scaling"]["original_max_position_embeddings"], 8);
  EXPECT_EQ(tied.load(s.path("tied")), tied.params);

  // q/k/v biases: Qwen2's layout (Llama's attention_bias would add an o_proj bias).
  const TinyLlama qwen([](model::ModelSpec& spec) { spec.qkv_bias = true; });
  qwen.export_to(s.path("qwen"), "bf16");
  const nlohmann::json qconfig = read_json(s.path("qwen/config.json"));
  EXPECT_EQ(qconfig["architectures"], nlohmann::json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(qconfig["model_type"], "qwen2");
  EXPECT_FALSE(qconfig.contains("attention_bias"));
  EXPECT_EQ(qconfig["use_sliding_window"], false);
  EXPECT_EQ(qconfig["torch_dtype"], "bfloat16");
  const io::HfModelDir dir(s.path("qwen"));
  EXPECT_TRUE(dir.config().qkv_bias);
  EXPECT_EQ(dir.dtype("model.layers.1.self_attn.v_proj.bias"), "BF16");
  // bf16 in, bf16 out: the widened values round back to the same bits.
  const std::vector<float> loaded = qwen.load(s.path("qwen"));
  for (size_t i = 0; i < loaded.size(); ++i)
    ASSERT_EQ(loaded[i], io::bf16_to_float(io::float_to_bf16(qwen.params[i]))) << i;
  TinyLlama again = qwen;
  again.params = loaded;
  again.export_to(s.path("qwen_again"), "bf16");
  const auto first = io::read_safetensors(s.path("qwen/model.safetensors"));
  const auto second = io::read_safetensors(s.path("qwen_again/model.safetensors"));
  ASSERT_EQ(first.size(), second.size());
  for (const auto& [name, t] : first) EXPECT_EQ(t.values, second.at(name).values) << name;
}

// Edits config.json of `dir` and returns the error train.init_from gives for model `m`.
std::string refusal(const TinyLlama& m, const std::string& dir, const std::function<void(nlohmann::json&)>& edit,
                    const model::ModelSpec* run = nullptr) {
  nlohmann::json config = read_json(dir + "/config.json");
  edit(config);
  write_json(dir + "/config.json", config);
  return user_error_message([&] { m.load(dir, run); });
}

TEST(HfLlama, KeysThatDifferFromTheRunAreNamedBothWays) {
  ScratchDir s;
  const TinyLlama m;
  const std::string dir = m.export_to(s.path("hf"));
  const std::string config = dir + "/config.json";
  std::string e = refusal(m, dir, [](nlohmann::json& c) { c["num_key_value_heads"] = 4; });
  EXPECT_NE(e.find("num_key_value_heads = 4 in " + config + ", model.n_kv_head = 2 in the run: set model.n_kv_head = 4"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("Hugging Face Llama directory"), std::string::npos) << e;
  // Every key that differs, in one message.
  e = refusal(m, dir, [](nlohmann::json& c) {
    c["num_key_value_heads"] = 2;
    c["rope_theta"] = 500000.0;
    c["rms_norm_eps"] = 1e-6;
    c["intermediate_size"] = 32;
  });
  EXPECT_NE(e.find("rope_theta = 500000 in"), std::string::npos) << e;
  EXPECT_NE(e.find("set model.ffn_hidden = 32, model.norm_eps = 0.000001, model.rope_theta = 500000"), std::string::npos) << e;
  e = refusal(m, dir, [](nlohmann::json& c) {
    c["rope_theta"] = 10000.0;
    c["rms_norm_eps"] = 1e-5;
    c["intermediate_size"] = 24;
    c["tie_word_embeddings"] = true;  // lm_head.weight is there, so this reads as a tied model
  });
  EXPECT_NE(e.find("tie_word_embeddings = true in " + config + ", model.tie_embeddings = false in the run"),
            std::string::npos)
      << e;
  e = refusal(m, dir, [](nlohmann::json& c) {
    c["tie_word_embeddings"] = false;
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  });
  EXPECT_NE(e.find("rope_scaling.rope_type = llama3 in " + config + ", model.rope_scaling = none in the run"),
            std::string::npos)
      << e;
  // The factors a run without scaling must set come with it (those equal to its defaults do not).
  EXPECT_NE(e.find("set model.rope_scaling = llama3, model.rope_factor = 32"), std::string::npos) << e;

  model::ModelSpec gpt2;  // a gpt2 run
  gpt2.vocab_size = 11;
  e = refusal(m, dir, [](nlohmann::json& c) { c["rope_scaling"] = nullptr; }, &gpt2);
  EXPECT_NE(e.find("model_type = llama in " + config + ", model.arch = gpt2 in the run: set model.arch = llama"),
            std::string::npos)
      << e;
  EXPECT_EQ(m.load(dir), m.params);  // the config as exported loads again
}

TEST(HfLlama, WhatKilterDoesNotComputeIsRefusedNamingTheField) {
  ScratchDir s;
  const TinyLlama m;
  const std::string dir = m.export_to(s.path("hf"));
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; },
       "rope_scaling.rope_type = \"yarn\" in " + dir + "/config.json is not supported"},
      {[](nlohmann::json& c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; }, "rope_scaling.type = \"linear\""},
      {[](nlohmann::json& c) { c["hidden_act"] = "gelu"; }, "hidden_act = \"gelu\" in"},
      {[](nlohmann::json& c) { c["head_dim"] = 8; }, "head_dim = 8 in"},
      {[](nlohmann::json& c) { c["mlp_bias"] = true; }, "mlp_bias = true in"},
      {[](nlohmann::json& c) { c["model_type"] = "phi3"; }, "model_type = \"phi3\" in"},
  };
  for (const auto& [edit, expected] : cases) {
    const std::string e = refusal(m, dir, [&](nlohmann::json& c) {
      c = read_json(s.path("hf/config.json"));
      c.erase("rope_scaling");
      c.erase("hidden_act");
      c.erase("head_dim");
      c.erase("mlp_bias");
      c["model_type"] = "llama";
      edit(c);
    });
    EXPECT_NE(e.find(expected), std::string::npos) << e;
  }
}

TEST(HfLlama, MistralAndQwen2Configs) {
  ScratchDir s;
  const TinyLlama m;
  const std::string dir = m.export_to(s.path("hf"));
  const auto as_mistral = [](int window) {
    return [window](nlohmann::json& c) {
      c = {{"model_type", "mistral"},      {"architectures", {"MistralForCausalLM"}}, {"vocab_size", 11},
           {"hidden_size", 16},            {"intermediate_size", 24},                 {"num_hidden_layers", 2},
           {"num_attention_heads", 4},     {"num_key_value_heads", 2},                {"head_dim", nullptr},
           {"rms_norm_eps", 1e-5},         {"sliding_window", window},                {"tie_word_embeddings", false}};
      if (window < 0) c["sliding_window"] = nullptr;
    };
  };
  std::string e = refusal(m, dir, as_mistral(8));
  EXPECT_NE(e.find("sliding_window = 8 in " + dir + "/config.json is shorter than the context, model.block_size = 16"),
            std::string::npos)
      << e;
  EXPECT_EQ(refusal(m, dir, as_mistral(16)), "");  // a window as long as the context is no window
  EXPECT_EQ(refusal(m, dir, as_mistral(-1)), "");
  EXPECT_EQ(m.load(dir), m.params);

  // Qwen2 always has q/k/v biases; a run without model.qkv_bias is told to set it.
  e = refusal(m, dir, [](nlohmann::json& c) {
    c["model_type"] = "qwen2";
    c["use_sliding_window"] = false;
    c["sliding_window"] = 4;
  });
  EXPECT_NE(e.find("q/k/v biases (model_type qwen2) = true in " + dir +
                   "/config.json, model.qkv_bias = false in the run: set model.qkv_bias = true"),
            std::string::npos)
      << e;
}

TEST(HfLlama, LlamaAttentionBiasLoadsOnlyWithZeroOutputBiases) {
  ScratchDir s;
  const TinyLlama m([](model::ModelSpec& spec) { spec.qkv_bias = true; });
  const std::string dir = m.export_to(s.path("hf"));
  // Rewrite the directory as Llama with attention_bias: o_proj gets a bias of its own.
  nlohmann::json config = read_json(dir + "/config.json");
  config["model_type"] = "llama";
  config["attention_bias"] = true;
  write_json(dir + "/config.json", config);
  std::vector<float> zeros(16, 0.0f), ones(16, 1.0f);
  const auto write_weights = [&](const std::vector<float>& o_bias) {
    std::vector<io::SafetensorsTensor> tensors;
    for (const model::ParamTensor& t : m.layout.tensors) tensors.push_back({t.name, t.shape, m.params.data() + t.offset, {}});
    for (int l = 0; l < 2; ++l)
      tensors.push_back({"model.layers." + std::to_string(l) + ".self_attn.o_proj.bias", {16}, o_bias.data(), {}});
    io::write_safetensors(dir + "/model.safetensors", tensors, "F32");
  };
  write_weights(zeros);
  EXPECT_EQ(m.load(dir), m.params);
  write_weights(ones);
  const std::string e = user_error_message([&] { m.load(dir); });
  EXPECT_NE(e.find("tensor model.layers.0.self_attn.o_proj.bias is not zero"), std::string::npos) << e;
}

TEST(HfLlama, UntiedGpt2ExportsItsHead) {
  ScratchDir s;
  model::ModelSpec spec{2, 2, 8, 16, 11};
  spec.tie_embeddings = "false";
  const model::ParamLayout layout = model::ParamLayout::build(spec);
  std::vector<float> params(layout.num_params);
  for (size_t i = 0; i < params.size(); ++i) params[i] = float(i % 89) * 0.01f;
  io::CheckpointInfo info;
  set_model_keys(info, spec);
  write_hf_model(s.path("hf"), info, layout, params.data(), {});
  EXPECT_EQ(read_json(s.path("hf/config.json"))["tie_word_embeddings"], false);
  EXPECT_TRUE(io::read_safetensors(s.path("hf/model.safetensors")).count("lm_head.weight"));
  std::string note;
  EXPECT_EQ(read_initial_weights(s.path("hf"), spec, layout, RunVocabulary{"data", "synthetic", "", 11}, "strict",
                                 std::vector<float>(layout.num_params), note),
            params);
}

}  // namespace
}  // namespace kilter::train

// The model's settings table (io/model_settings.h) reaches every place a setting lives: each row is
// a [model] option with its help and default, an INI key that sets the spec, a checkpoint
// attribute that round-trips, and, where the table names a config.json field, a field that
// round-trips through the HF export and import. A row added to the table is checked here without
// a line of this file changing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>

#include "io/checkpoint.h"
#include "io/export/hf_config.h"
#include "lib/core/config.h"
#include "lib/train/checkpoint_model.h"
#include "lib/train/hf_interop.h"

namespace {

namespace fs = std::filesystem;
namespace io = kilter::io;
namespace model = kilter::model;

// A value other than `value`, in each type's way.
void change(int& value) { value += 2; }
void change(double& value) { value = value * 2 + 0.5; }
void change(bool& value) { value = !value; }
void change(std::string& value) { value += "-changed"; }

std::string scratch_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kilter-settings-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

TEST(ModelSettings, EveryRowIsAModelOptionWithItsHelpAndDefault) {
  kilter::Config cfg;
  boost::program_options::options_description desc;
  kilter::add_config_options(desc, cfg);
  const model::ModelSpec defaults;
  io::for_each_model_setting(defaults, [&](const io::ModelSettingInfo& key, const auto&) {
    const auto* option = desc.find_nothrow("model." + std::string(key.name), false);
    ASSERT_NE(option, nullptr) << key.name;
    EXPECT_EQ(option->description(), key.help) << key.name;
  });
  // The config's [model] section is the table, in its order: the ini lines before [data].
  std::istringstream ini(cfg.to_ini());
  std::string line;
  std::getline(ini, line);
  EXPECT_EQ(line, "[model]");
  io::for_each_model_setting(defaults, [&](const io::ModelSettingInfo& key, const auto&) {
    std::getline(ini, line);
    EXPECT_EQ(line.substr(0, line.find(" = ")), key.name);
  });
}

TEST(ModelSettings, EveryRowIsSetByItsIniKeyAndRoundTripsThroughACheckpoint) {
  model::ModelSpec changed;
  std::string ini = "[model]\n";
  io::for_each_model_setting(changed, [&](const io::ModelSettingInfo& key, auto& value) {
    change(value);
    std::ostringstream text;
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, bool>)
      text << (value ? "true" : "false");
    else
      text << value;
    ini += std::string(key.name) + " = " + text.str() + "\n";
  });
  // The INI key sets the field (no validation: the changed values need not make a model).
  const kilter::Config parsed = kilter::config_from_ini_text(ini);
  EXPECT_TRUE(io::same_model_settings(parsed.model, changed));

  io::CheckpointContents contents;
  kilter::train::set_model_keys(contents.info, changed);
  contents.tensors = {{"w", {2}, 0, 2}};
  contents.params = contents.adam_m = contents.adam_v = {1.0f, 2.0f};
  const std::string dir = scratch_dir("checkpoint");
  const std::string path = dir + "/" + io::checkpoint_file_name(1);
  io::write_checkpoint_file(path, contents);
  const model::ModelSpec back = kilter::train::spec_of(io::read_checkpoint_info(path));
  EXPECT_TRUE(io::same_model_settings(back, changed));
  fs::remove_all(dir);
}

TEST(ModelSettings, NumericRowsWithAnHfFieldRoundTripThroughConfigJson) {
  for (const bool llama : {false, true}) {
    model::ModelSpec spec;
    spec.arch = llama ? "llama" : "gpt2";
    spec.n_layer = 3, spec.n_head = 4, spec.n_kv_head = llama ? 2 : 0, spec.n_embd = 64;
    spec.block_size = 96, spec.vocab_size = 101, spec.ffn_hidden = 160, spec.norm_eps = 3e-6;
    if (llama) {
      spec.rope_theta = 50000, spec.rope_scaling = "llama3", spec.rope_factor = 16;
      spec.rope_low_freq_factor = 2, spec.rope_high_freq_factor = 6, spec.rope_original_context = 48;
    }
    const io::HfModelConfig exported = kilter::train::hf_config_of(spec, 7);
    const std::string dir = scratch_dir(llama ? "llama" : "gpt2");
    std::ofstream(dir + "/config.json") << io::hf_config_json(exported, "fp32").dump(2);
    const io::HfModelConfig imported = io::read_hf_config(dir);
    io::for_each_model_setting(imported, [&](const io::ModelSettingInfo& key, const auto& value) {
      using T = std::decay_t<decltype(value)>;
      if constexpr (std::is_same_v<T, int> || std::is_same_v<T, double>) {
        if (io::hf_field_name(key, llama).empty()) return;
        io::for_each_model_setting(exported, [&](const io::ModelSettingInfo& other, const auto& original) {
          if constexpr (std::is_same_v<std::decay_t<decltype(original)>, T>)
            if (std::string(other.name) == key.name) EXPECT_EQ(value, original) << key.name << " llama " << llama;
        });
      }
    });
    EXPECT_TRUE(kilter::train::spec_of_hf(imported) == spec) << "llama " << llama;
    fs::remove_all(dir);
  }
}

}  // namespace

// kilter_hf_tool: kilter's side of the Hugging Face interop tests (tests/e2e/hf_export.sh,
// tests/e2e/hf_import.sh).
//   kilter_hf_tool logits SOURCE ID,ID,... OUT.f32   kilter's forward (lib/model/generate.h, the
//       model `kilter sample` runs) over the ids of a checkpoint or run dir SOURCE: the logits at
//       every position, raw float32 [n, vocab].
//   kilter_hf_tool roundtrip HF_DIR OUT_DIR [bf16]   the weights of HF_DIR (GPT-2 or the Llama family)
//       through train.init_from's reading (read_initial_weights, for a run whose model.* keys are
//       the config's) and back out through export's writing (write_hf_model), fp32 or bf16.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "io/export/hf_directory.h"
#include "lib/train/checkpoint_model.h"
#include "lib/model/generate.h"
#include "lib/train/hf_interop.h"
#include "lib/train/sampling.h"

namespace {

int logits(const std::string& source, const std::string& ids_text, const std::string& out_path) {
  kilter::train::SamplingModel m = kilter::train::load_sampling_model(source);
  std::vector<int32_t> ids;
  std::istringstream is(ids_text);
  for (std::string item; std::getline(is, item, ',');) ids.push_back(std::stoi(item));
  kilter::model::Generator generator(m.gpt, std::move(m.params));
  std::ofstream out(out_path, std::ios::binary);
  for (int32_t id : ids) {
    const float* row = generator.feed(&id, 1);
    out.write(reinterpret_cast<const char*>(row), std::streamsize(sizeof(float) * size_t(m.gpt.vocab_size)));
  }
  KILTER_CHECK(out.good(), out_path << ": cannot write");
  std::printf("kilter_hf_tool: %zu positions x %d logits -> %s\n", ids.size(), m.gpt.vocab_size, out_path.c_str());
  return 0;
}

int roundtrip(const std::string& hf_dir, const std::string& out, const std::string& dtype) {
  const kilter::io::HfModelDir hf(hf_dir);
  const kilter::model::ModelSpec spec = kilter::train::spec_of_hf(hf.config());
  const kilter::model::ParamLayout layout = kilter::model::ParamLayout::build(spec);
  std::string note;
  const kilter::train::RunVocabulary vocab{hf_dir, "", "", spec.vocab_size};
  std::vector<float> params(layout.num_params);
  kilter::train::read_initial_weights(hf_dir, spec, layout, vocab, "strict", params.data(), note);
  kilter::io::CheckpointInfo info;
  kilter::train::set_model_keys(info, spec);
  info.eos_id = hf.config().eos_id;
  kilter::io::HfExportOptions options;
  options.dtype = dtype;
  kilter::train::write_hf_model(out, info, layout, params.data(), options);
  std::printf("kilter_hf_tool: %s -> %s (%s)\n", hf_dir.c_str(), out.c_str(), note.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "logits" && argc == 5) return logits(argv[2], argv[3], argv[4]);
    if (mode == "roundtrip" && (argc == 4 || argc == 5)) return roundtrip(argv[2], argv[3], argc == 5 ? argv[4] : "fp32");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kilter_hf_tool: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: kilter_hf_tool logits SOURCE ID,ID,... OUT.f32 | roundtrip HF_DIR OUT_DIR [bf16]\n");
  return 2;
}

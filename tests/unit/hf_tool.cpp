// kilter_hf_tool: kilter's side of the Hugging Face interop tests (tests/e2e/hf_export.sh,
// tests/e2e/hf_import.sh).
//   kilter_hf_tool logits SOURCE ID,ID,... OUT.f32   kilter's forward (lib/model/generate.h, the
//       model `kilter sample` runs) over the ids of a checkpoint or run dir SOURCE: the logits at
//       every position, raw float32 [n, vocab].
//   kilter_hf_tool roundtrip HF_DIR OUT_DIR          the weights of HF_DIR through train.init_from's
//       reading (read_initial_weights) and back out through export's writing (write_hf_model).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/error.h"
#include "io/export/hf_gpt2.h"
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

int roundtrip(const std::string& hf_dir, const std::string& out) {
  const kilter::io::HfGpt2 hf = kilter::io::read_hf_gpt2(hf_dir);
  const kilter::model::ModelSpec gpt{int(hf.shape.n_layer), int(hf.shape.n_head), int(hf.shape.n_embd),
                                     int(hf.shape.block_size), int(hf.shape.vocab_size)};
  const kilter::model::ParamLayout layout = kilter::model::ParamLayout::build(gpt);
  std::string note;
  const kilter::train::RunVocabulary vocab{hf_dir, "", "", hf.shape.vocab_size};
  const std::vector<float> params = kilter::train::read_initial_weights(
      hf_dir, gpt, layout, vocab, "strict", std::vector<float>(layout.num_params), note);
  kilter::io::CheckpointInfo info;
  info.n_layer = gpt.n_layer, info.n_head = gpt.n_head, info.n_embd = gpt.n_embd;
  info.block_size = gpt.block_size, info.vocab_size = gpt.vocab_size, info.eos_id = hf.eos_id;
  kilter::train::write_hf_model(out, info, layout, params.data(), {});
  std::printf("kilter_hf_tool: %s -> %s (%s)\n", hf_dir.c_str(), out.c_str(), note.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "logits" && argc == 5) return logits(argv[2], argv[3], argv[4]);
    if (mode == "roundtrip" && argc == 4) return roundtrip(argv[2], argv[3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kilter_hf_tool: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: kilter_hf_tool logits SOURCE ID,ID,... OUT.f32 | roundtrip HF_DIR OUT_DIR\n");
  return 2;
}

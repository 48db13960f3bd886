// Hugging Face GPT-2 names and the whole-directory reader (see hf_gpt2.h).
#include "io/export/hf_gpt2.h"

#include "io/base/error.h"

namespace kilter::io {

bool hf_is_conv1d(const std::string& name) {
  for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
}

HfGpt2 read_hf_gpt2(const std::string& dir) {
  const HfModelDir source(dir);
  KILTER_USER_CHECK(!source.config().llama_family(), source.config_path() << ": model_type = " << source.config().model_type
                                                                          << " is not GPT-2");
  HfGpt2 model;
  model.dir = dir;
  model.shape = source.config();
  model.eos_id = source.config().eos_id;
  for (const auto& [name, shape] : source.shapes()) {
    uint64_t count = 1;
    for (int64_t d : shape) count *= uint64_t(d);
    std::vector<float> values(static_cast<size_t>(count));
    source.read(name, values.data());
    model.shapes[name] = shape;
    model.values[name] = std::move(values);
  }
  const auto head = model.values.find("lm_head.weight");
  if (head != model.values.end() && model.shape.tied()) {
    const auto wte = model.values.find("transformer.wte.weight");
    KILTER_USER_CHECK(wte != model.values.end() && wte->second == head->second,
                      dir << ": lm_head.weight differs from transformer.wte.weight though tie_word_embeddings is true");
    model.shapes.erase("lm_head.weight");
    model.values.erase(head);
  }
  model.tokenizer_json = source.tokenizer_json();
  return model;
}

}  // namespace kilter::io

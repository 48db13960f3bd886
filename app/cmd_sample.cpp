// `kilter sample`: generate text from a checkpoint (lib/train/sampling.h, lib/model/generate.h).
// Runs in one process on the CPU; no MPI.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "io/base/error.h"
#include "lib/core/config.h"
#include "lib/model/gemm.h"
#include "lib/train/sampling.h"

namespace po = boost::program_options;

namespace kilter::app {

namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  std::istringstream is(text);
  while (std::getline(is, item, ',')) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KILTER_CHECK(used > 0 && used == item.size() && v >= 0 && v <= INT32_MAX,
                 "--prompt-tokens: '" << item << "' is not a token id (give ID,ID,...)");
    ids.push_back(int32_t(v));
  }
  KILTER_CHECK(!ids.empty(), "--prompt-tokens: no id given");
  return ids;
}

int run_sample(int argc, char** argv) {
  std::string run, checkpoint, prompt, prompt_tokens;
  model::SamplingOptions options;
  bool json = false, ignore_eos = false;
  int threads = 0;
  po::options_description desc("options");
  desc.add_options()
      ("help,h", "show this help")
      ("run", po::value(&run), "run directory: its newest checkpoint (RUN_DIR/checkpoints/step-*.h5)")
      ("checkpoint", po::value(&checkpoint), "a checkpoint file")
      ("prompt", po::value(&prompt)->default_value(""), "text to continue (empty: a new document, its first token drawn from the training documents' first tokens)")
      ("prompt-tokens", po::value(&prompt_tokens), "the prompt as ids ID,ID,... (for datasets without a tokenizer)")
      ("max-new-tokens", po::value(&options.max_new_tokens)->default_value(options.max_new_tokens), "tokens to generate at most")
      ("temperature", po::value(&options.temperature)->default_value(options.temperature), "softmax temperature; 0 = greedy")
      ("top-k", po::value(&options.top_k)->default_value(options.top_k), "sample among the k most likely ids (0: all)")
      ("seed", po::value(&options.seed)->default_value(options.seed), "random seed (same seed, same text)")
      ("ignore-eos", po::bool_switch(&ignore_eos), "keep generating past the EOS id (benchmarks, tests)")
      ("threads", po::value(&threads)->default_value(0), "GEMM threads (0: the engine's default, OMP_NUM_THREADS for oneDNN)")
      ("json", po::bool_switch(&json), "print one JSON object: prompt, completion, tokens, stop_reason, timings");
  po::variables_map vm;
  po::store(parse_exact(argc, argv, desc, "kilter sample"), vm);
  if (vm.count("help")) {
    std::cout << "usage: kilter sample (--run RUN_DIR | --checkpoint FILE) --prompt TEXT [--max-new-tokens N]\n"
                 "                     [--temperature T] [--top-k K] [--seed S] [--json]\n\n"
                 "Generates text from a checkpoint on the CPU with a KV cache (a new token costs O(context)),\n"
                 "decoded with the tokenizer the checkpoint records (the dataset's). Stops at the EOS id, at\n"
                 "--max-new-tokens, or when the sequence fills the model's context (model.block_size).\n"
                 "Prints the prompt and its continuation on stdout, timings on stderr.\n\n"
              << desc << "\n";
    return 0;
  }
  po::notify(vm);
  KILTER_CHECK(run.empty() != checkpoint.empty(), "give exactly one of --run RUN_DIR and --checkpoint FILE");
  if (threads > 0) model::set_gemm_threads(threads);

  train::SamplingModel m = train::load_sampling_model(run.empty() ? checkpoint : run);
  if (!m.note.empty()) std::fprintf(stderr, "kilter sample: %s: %s\n", m.checkpoint.c_str(), m.note.c_str());
  const std::vector<int32_t> ids = prompt_tokens.empty() ? std::vector<int32_t>() : parse_ids(prompt_tokens);
  std::vector<int32_t> prompt_ids =
      train::prompt_ids(m.codec, prompt, ids, !prompt_tokens.empty(), "checkpoint " + m.checkpoint);
  // An empty prompt: the first token comes from the training documents' first tokens, which the
  // checkpoint records (or, in older checkpoints, the model continues the EOS id).
  const bool unprompted = prompt_ids.empty();
  if (unprompted) {
    std::string note;
    prompt_ids = train::unprompted_start(m.codec, m.starts, "checkpoint " + m.checkpoint, note);
    if (!note.empty()) std::fprintf(stderr, "kilter sample: %s: %s\n", m.checkpoint.c_str(), note.c_str());
  }
  options.eos_id = ignore_eos ? -1 : m.codec.eos_id;
  model::Generator generator(m.gpt, std::move(m.params));
  const model::Generation g = model::generate(generator, prompt_ids, options, &m.starts);
  const std::string completion = m.codec.continuation(prompt_ids, g.tokens);
  const std::string prompt_text = prompt_tokens.empty() ? prompt : m.codec.decode(prompt_ids);
  const double rate = g.decode_seconds > 0 ? double(g.tokens.size()) / g.decode_seconds : 0.0;

  if (json) {
    nlohmann::json out;
    out["prompt"] = prompt_text;
    out["completion"] = completion;
    out["tokens"] = g.tokens;
    out["prompt_tokens"] = prompt_ids;
    out["new_tokens"] = g.tokens.size();
    out["stop_reason"] = g.stop_reason;
    out["start"] = !unprompted ? "prompt" : prompt_ids.empty() ? "document_starts" : "eos";
    out["checkpoint"] = m.checkpoint;
    out["step"] = m.step;
    out["tokenizer"] = m.codec.kind;
    out["eos_id"] = m.codec.eos_id;
    out["temperature"] = options.temperature;
    out["top_k"] = options.top_k;
    out["seed"] = options.seed;
    out["prefill_seconds"] = g.prefill_seconds;
    out["decode_seconds"] = g.decode_seconds;
    out["tokens_per_second"] = rate;
    // Tokenizers may cut a multi-byte character; replace invalid UTF-8 rather than fail.
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s%s\n", prompt_text.c_str(), completion.c_str());
    std::fprintf(stderr, "kilter sample: step %lld of %s: %zu prompt + %zu new tokens, %.1f tok/s, stopped: %s\n",
                 (long long)m.step, m.checkpoint.c_str(), prompt_ids.size(), g.tokens.size(), rate,
                 g.stop_reason.c_str());
  }
  return 0;
}

}  // namespace

int cmd_sample(int argc, char** argv) {
  try {
    return run_sample(argc, argv);
  } catch (const po::error& e) {
    std::fprintf(stderr, "kilter sample: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kilter sample: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace kilter::app

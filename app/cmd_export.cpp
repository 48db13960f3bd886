// `kilter export --format hf`: a checkpoint as a Hugging Face model directory, GPT-2 or Llama
// (lib/train/hf_interop.h, io/export/). One process, no MPI.
#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>
#include <string>

#include "app/commands.h"
#include "io/base/error.h"
#include "lib/train/hf_interop.h"

namespace po = boost::program_options;

namespace kilter::app {

namespace {

int run_export(int argc, char** argv) {
  std::string format, run, checkpoint, out;
  io::HfExportOptions options;
  po::options_description desc("options");
  desc.add_options()
      ("help,h", "show this help")
      ("format", po::value(&format), "output format: hf (Hugging Face: config.json, model.safetensors, generation_config.json, tokenizer files)")
      ("run", po::value(&run), "run directory: its newest checkpoint (RUN_DIR/checkpoints/step-*.h5)")
      ("checkpoint", po::value(&checkpoint), "a checkpoint file")
      ("out", po::value(&out), "output directory (written under a temporary name, then renamed)")
      ("dtype", po::value(&options.dtype)->default_value(options.dtype), "tensor type in model.safetensors: fp32 | bf16 (rounded to nearest even)")
      ("force", po::bool_switch(&options.force), "replace an existing non-empty --out");
  po::variables_map vm;
  po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: kilter export --format hf (--run RUN_DIR | --checkpoint FILE) --out DIR [--dtype fp32|bf16]\n\n"
                 "Writes a checkpoint as a Hugging Face model directory that transformers' from_pretrained (and tools\n"
                 "that read config.json + model.safetensors) load: model.arch = gpt2 as GPT2LMHeadModel (Conv1D\n"
                 "layout), model.arch = llama as LlamaForCausalLM (as Qwen2ForCausalLM with model.qkv_bias); the\n"
                 "weights (a tied LM head is not stored), config.json, generation_config.json, and the dataset's\n"
                 "tokenizer files (hf-bpe: tokenizer.json; sentencepiece: tokenizer.model; byte-level datasets have none).\n\n"
              << desc << "\n";
    return 0;
  }
  po::notify(vm);
  KILTER_CHECK(format == "hf", (format.empty() ? std::string("--format is missing") : "--format " + format + " is unknown")
                                   << ": kilter export writes --format hf");
  KILTER_CHECK(run.empty() != checkpoint.empty(), "give exactly one of --run RUN_DIR and --checkpoint FILE");
  KILTER_CHECK(!out.empty(), "--out DIR is missing: name the directory to write");
  const train::HfExportResult r = train::export_hf(run.empty() ? checkpoint : run, out, options);
  std::string files;
  for (const std::string& f : r.files) files += (files.empty() ? "" : ", ") + f;
  std::fprintf(stderr, "kilter export: step %lld of %s -> %s (%s, %s; %s)\n", (long long)r.step, r.checkpoint.c_str(),
               out.c_str(), options.dtype.c_str(), r.architecture.c_str(), files.c_str());
  return 0;
}

}  // namespace

int cmd_export(int argc, char** argv) {
  try {
    return run_export(argc, argv);
  } catch (const po::error& e) {
    std::fprintf(stderr, "kilter export: %s (see kilter export --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kilter export: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace kilter::app

// `kilter prep --format llmc|nanogpt|megatron|npy`: imports an already tokenized corpus
// (io/import/import.h). cmd_prep hands over here when --format names an import format.
#include <boost/program_options.hpp>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "io/import/import.h"
#include "lib/core/config.h"

namespace po = boost::program_options;

namespace kilter::app {

bool prep_is_import(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--format=", 0) == 0) return io::is_import_format(arg.substr(9));
    if (arg == "--format" && i + 1 < argc) return io::is_import_format(argv[i + 1]);
  }
  return false;
}

namespace {
std::string format_argument(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--format=", 0) == 0) return arg.substr(9);
    if (arg == "--format" && i + 1 < argc) return argv[i + 1];
  }
  return "";
}
}  // namespace

int prep_import(int argc, char** argv) {
  io::ImportOptions options;
  std::string format;
  bool quiet = false;
  po::options_description desc("options");
  desc.add_options()
      ("help,h", "show this help")
      ("format", po::value(&format)->required(),
       "llmc (llm.c .bin: 256-int32 header, magic 20240520 v1 uint16 / v2 uint32, or 20240801 v7) | "
       "nanogpt (flat uint16 .bin) | megatron (Megatron-LM .idx + .bin; give either or the prefix) | "
       "npy (1-D integer .npy)")
      ("input", po::value(&options.inputs)->multitoken()->required(),
       "input files, in stream order (a document may continue into the next file, except for megatron)")
      ("eot", po::value(&options.eot),
       "end-of-text id that separates documents (default: the tokenizer's EOS, else the format's "
       "convention: 50256, or 128000 for llm.c LLaMA-3 files); it is not stored, the reader appends it")
      ("vocab", po::value(&options.vocab),
       "vocab_size of the dataset (default: the tokenizer's, else the largest id + 1, with a warning)")
      ("tokenizer", po::value(&options.tokenizer),
       "attach the tokenizer that made the ids (SentencePiece *.model, HF tokenizer.json, or 'byte'), so "
       "training samples and `kilter sample` decode text; without it the dataset's tokenizer is 'imported' (ids only)")
      ("shards", po::value(&options.shards)->default_value(1), "number of shards (roughly equal token counts)")
      ("out", po::value(&options.out)->required(), "output dataset directory (written atomically)")
      ("force", po::bool_switch(&options.force), "replace an existing non-empty output directory")
      ("quiet", po::bool_switch(&quiet), "no progress on stderr");
  po::variables_map vm;
  po::store(parse_exact(argc, argv, desc, "kilter prep --format " + format_argument(argc, argv)), vm);
  if (vm.count("help")) {
    std::cout << "usage: kilter prep --format llmc|nanogpt|megatron|npy --input FILE... [--eot ID] [--vocab V]\n"
                 "                   [--tokenizer FILE] --shards N --out DIR\n\n"
                 "Imports a corpus another pipeline already tokenized. Documents are split at the EOT id and,\n"
                 "for megatron, at its document index; empty documents are dropped. Every structural fault\n"
                 "(bad magic, a count the file cannot hold, an id out of range, a truncated file, a bad npy\n"
                 "header, an unsupported dtype) is an error naming the file and the byte offset.\n\n"
              << desc << "\n";
    return 0;
  }
  po::notify(vm);
  options.format = io::parse_import_format(format);
  options.progress = !quiet;
  const io::ImportReport r = io::import_dataset(options);
  std::printf("prep %s: wrote %s: %u shards, %llu documents, %llu tokens, vocab_size %u%s, eos_id %u, "
              "tokenizer %s, %llu EOT ids, %.1f MB read, %.2f s\n",
              io::import_format_name(options.format), r.out.c_str(), r.shards, (unsigned long long)r.documents,
              (unsigned long long)r.tokens, r.vocab_size, r.vocab_inferred ? " (inferred)" : "", r.eos_id,
              r.tokenizer.c_str(), (unsigned long long)r.eot_tokens, r.input_bytes / 1e6, r.seconds);
  return 0;
}

}  // namespace kilter::app

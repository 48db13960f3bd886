// `kilter prep`, `kilter prep synth` and `kilter prep validate`: parse options, call io/.
#include <boost/program_options.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "io/dataset.h"
#include "io/base/error.h"
#include "lib/core/config.h"
#include "io/prep.h"
#include "io/tokenizer/tokenizer_train.h"

namespace po = boost::program_options;

namespace kilter::app {

namespace {

void print_report(const io::PrepReport& report, const char* what) {
  std::printf("%s: wrote %s: %u shards, %llu documents, %llu tokens (shard tokens %llu..%llu)",
              what, report.out.c_str(), report.shards, (unsigned long long)report.documents,
              (unsigned long long)report.tokens, (unsigned long long)report.min_shard_tokens,
              (unsigned long long)report.max_shard_tokens);
  if (report.input_bytes > 0)
    std::printf(", %llu empty documents dropped, %.1f MB read",
                (unsigned long long)report.empty_documents, report.input_bytes / 1e6);
  if (report.bad_lines > 0) std::printf(", %llu bad lines skipped", (unsigned long long)report.bad_lines);
  std::printf(", %.2f s\n", report.seconds);
  if (report.null_cells > 0 || report.non_string_cells > 0)
    std::fprintf(stderr, "prep: skipped %llu null and %llu non-string cells of the text column (and %llu empty strings)\n",
                 (unsigned long long)report.null_cells, (unsigned long long)report.non_string_cells,
                 (unsigned long long)report.empty_documents);
  for (const std::string& example : report.bad_line_examples) std::fprintf(stderr, "prep: skipped %s\n", example.c_str());
  if (report.bad_lines > report.bad_line_examples.size())
    std::fprintf(stderr, "prep: ... and %llu more bad lines skipped\n",
                 (unsigned long long)(report.bad_lines - report.bad_line_examples.size()));
  if (report.tokenizer != "byte" && report.tokenizer != "synthetic")
    std::printf("tokenizer: %s, vocab_size %u, eos_id %u%s (recorded in index.h5)\n", report.tokenizer.c_str(),
                report.vocab_size, report.eos_id,
                report.bos_id >= 0 ? (", every document begins with bos_id " + std::to_string(report.bos_id)).c_str()
                                   : "");
}

// Parses argv with `desc` (+ positional), printing help for --help. Returns false on --help.
bool parse(int argc, char** argv, po::options_description& desc, po::variables_map& vm,
           const char* usage, const std::string& help_command,
           const po::positional_options_description* positional = nullptr) {
  po::store(parse_exact(argc, argv, desc, help_command, positional), vm);
  if (vm.count("help")) {
    std::cout << usage << "\n" << desc << "\n";
    return false;
  }
  po::notify(vm);
  return true;
}

// The format the inputs' extensions name (.jsonl/.json: jsonl, .txt: text), "" when they name
// none or disagree. Directories are not looked into.
std::string format_of_extensions(const std::vector<std::string>& inputs) {
  std::string found;
  for (const std::string& input : inputs) {
    const std::string ext = std::filesystem::path(input).extension().string();
    std::string format;
    if (ext == ".jsonl" || ext == ".json") format = "jsonl";
    else if (ext == ".parquet") format = "parquet";
    else if (ext == ".arrow") format = "arrow";
    else if (ext == ".txt") format = "text";
    else if (std::filesystem::is_directory(input) || ext.empty()) continue;
    else return "";
    if (!found.empty() && found != format) return "";
    found = format;
  }
  return found;
}

int prep_corpus(int argc, char** argv) {
  io::PrepOptions options;
  std::string format = "text";
  bool quiet = false;
  po::options_description desc("options");
  desc.add_options()
      ("help,h", "show this help")
      ("input", po::value(&options.inputs)->multitoken()->required(),
       "input files or directories (a directory: its regular files, sorted; fortune: *.dat skipped); "
       "gzip (.gz) and zstd (.zst) files are decompressed as they stream")
      ("format", po::value(&format)->default_value("text"),
       "text (a file is one document) | jsonl ({\"text\": ...} per line) | fortune (documents between '%' lines) | "
       "parquet (a column of .parquet files, row group by row group; a directory: its *.parquet files) | "
       "arrow (a column of Arrow IPC files or streams, e.g. Hugging Face datasets' cache *.arrow files)")
      ("text-key", po::value(&options.corpus.text_key)->default_value(options.corpus.text_key),
       "jsonl: the field holding the text; parquet, arrow: the column; a dotted path (meta.content) reaches into "
       "objects (structs)")
      ("max-bad-lines", po::value(&options.corpus.max_bad_lines)->default_value(options.corpus.max_bad_lines),
       "jsonl: lines that are not JSON or lack the text field are skipped and counted up to N "
       "(0: the first is an error naming FILE:LINE)")
      ("shards", po::value(&options.shards)->default_value(1), "number of shards (roughly equal token counts)")
      ("tokenizer", po::value(&options.tokenizer),
       "a SentencePiece *.model or a Hugging Face tokenizer.json (byte-level BPE); default: bytes")
      ("threads", po::value(&options.threads)->default_value(0),
       "tokenizer threads, and Parquet row groups decoded at once (0: every core); the output does not depend on it")
      ("bos", po::bool_switch(&options.bos),
       "put the tokenizer's BOS token before every document (Llama's <s> or <|begin_of_text|>: what its own "
       "post-processor adds), so continued pretraining sees documents as the model was trained; refused where "
       "the tokenizer defines none")
      ("out", po::value(&options.out)->required(), "output dataset directory (written atomically)")
      ("force", po::bool_switch(&options.force), "replace an existing non-empty output directory")
      ("quiet", po::bool_switch(&quiet), "no progress on stderr");
  po::variables_map vm;
  if (!parse(argc, argv, desc, vm,
             "usage: kilter prep --input PATH... --format text|jsonl|fortune|parquet|arrow [--tokenizer FILE] --shards N --out DIR\n"
             "       kilter prep tokenizer train --help\n"
             "       kilter prep --format llmc|nanogpt|megatron|npy --help   (import an already tokenized corpus)\n"
             "       kilter prep synth --help | kilter prep validate DIR\n\n"
             "Without --tokenizer: token = byte value (0..255), eos_id = 256, vocab_size = 257;\n"
             "non-UTF-8 bytes are kept as bytes.\n"
             "With --tokenizer FILE: a SentencePiece model (*.model) or a Hugging Face tokenizer.json\n"
             "with a byte-level BPE model (GPT-2, RoBERTa, Llama-3 style). vocab_size and eos_id come\n"
             "from the tokenizer (its </s>, <|endoftext|>, <|end_of_text|> or <eos>; a tokenizer with\n"
             "none gets one extra id, eos_id = its vocabulary size). No BOS or other special token is\n"
             "added. The file is recorded in index.h5, so training and sampling decode with it.\n"
             "Empty documents (and documents that encode to no ids) are dropped and counted.",
             "kilter prep"))
    return 0;
  // A .jsonl file read as text would become one document of raw JSON: the extension decides when
  // --format is not given, and a --format that disagrees gets a warning.
  const std::string by_extension = format_of_extensions(options.inputs);
  if (vm["format"].defaulted() && !by_extension.empty()) {
    if (by_extension != format && !quiet)
      std::fprintf(stderr, "kilter prep: --format %s, from the inputs' extension (give --format to override)\n",
                   by_extension.c_str());
    format = by_extension;
  } else if (!by_extension.empty() && by_extension != format) {
    std::fprintf(stderr, "kilter prep: warning: --format %s, but the inputs' extension says %s; reading them as %s\n",
                 format.c_str(), by_extension.c_str(), format.c_str());
  }
  options.format = io::parse_input_format(format);
  options.progress = !quiet;
  print_report(io::prepare_dataset(options), "prep");
  return 0;
}

int prep_synth(int argc, char** argv) {
  io::SynthOptions options;
  bool quiet = false;
  po::options_description desc("options");
  desc.add_options()
      ("help,h", "show this help")
      ("docs", po::value(&options.docs)->default_value(options.docs), "number of documents")
      ("lengths", po::value(&options.lengths)->default_value(options.lengths),
       "document lengths in tokens: lognormal:MU,SIGMA[,MAX] (round(exp(N(MU,SIGMA))), clamped to [1,MAX]) "
       "| uniform:MIN,MAX (inclusive)")
      ("vocab", po::value(&options.vocab)->default_value(options.vocab),
       "vocab_size V: tokens uniform in [0, V-1), eos_id = V-1")
      ("shards", po::value(&options.shards)->default_value(options.shards), "number of shards")
      ("seed", po::value(&options.seed)->default_value(options.seed), "random seed (same seed, same dataset)")
      ("out", po::value(&options.out)->required(), "output dataset directory (written atomically)")
      ("force", po::bool_switch(&options.force), "replace an existing non-empty output directory")
      ("quiet", po::bool_switch(&quiet), "no progress on stderr");
  po::variables_map vm;
  if (!parse(argc, argv, desc, vm,
             "usage: kilter prep synth --docs N --lengths lognormal:MU,SIGMA[,MAX]|uniform:MIN,MAX "
             "--vocab V --shards N --seed S --out DIR",
             "kilter prep synth"))
    return 0;
  options.progress = !quiet;
  print_report(io::synthesize_dataset(options), "prep synth");
  return 0;
}

int prep_tokenizer_train(int argc, char** argv) {
  io::TokenizerTrainOptions options;
  std::string format = "text";
  bool quiet = false;
  po::options_description desc("options");
  desc.add_options()
      ("help,h", "show this help")
      ("input", po::value(&options.inputs)->multitoken()->required(), "input files or directories, as for kilter prep")
      ("format", po::value(&format)->default_value("text"), "text | jsonl | fortune, as for kilter prep")
      ("vocab", po::value(&options.vocab)->required(), "vocabulary size (pieces, including <unk> <s> </s>)")
      ("kind", po::value(&options.kind)->default_value(options.kind), "bpe | unigram")
      ("sample", po::value(&options.sample)->default_value(options.sample),
       "lines (sentences) drawn uniformly from the corpus to train on")
      ("character-coverage", po::value(&options.character_coverage)->default_value(options.character_coverage),
       "share of characters the vocabulary covers (the rest become <unk>, or bytes with --byte-fallback)")
      ("byte-fallback", po::bool_switch(&options.byte_fallback), "encode uncovered characters as <0xNN> byte pieces")
      ("seed", po::value(&options.seed)->default_value(options.seed), "seed of the line sample")
      ("out", po::value(&options.out)->required(), "the model file to write (FILE.model)")
      ("quiet", po::bool_switch(&quiet), "no progress and no trainer log on stderr");
  po::variables_map vm;
  if (!parse(argc, argv, desc, vm,
             "usage: kilter prep tokenizer train --input PATH... --vocab N [--kind bpe|unigram] --out FILE.model\n\n"
             "Trains a SentencePiece model with the library's trainer on the lines of the corpus\n"
             "(read as kilter prep reads it); use it with kilter prep --tokenizer FILE.model.",
             "kilter prep tokenizer train"))
    return 0;
  options.format = io::parse_input_format(format);
  options.progress = !quiet;
  io::TokenizerTrainReport report = io::train_sentencepiece(options);
  std::printf("prep tokenizer train: wrote %s: %s, vocab_size %u, trained on %llu of %llu lines "
              "(%llu documents), %.2f s\n",
              report.out.c_str(), options.kind.c_str(), report.vocab,
              (unsigned long long)report.sampled_sentences, (unsigned long long)report.sentences,
              (unsigned long long)report.documents, report.seconds);
  return 0;
}

int prep_validate(int argc, char** argv) {
  std::string dir;
  po::options_description desc("options");
  desc.add_options()
      ("help,h", "show this help")
      ("dir", po::value(&dir), "dataset directory (the positional argument DIR)");
  po::positional_options_description positional;
  positional.add("dir", 1);
  po::variables_map vm;
  if (!parse(argc, argv, desc, vm,
             "usage: kilter prep validate DIR\n\n"
             "Checks index.h5 and every shard: attributes, dtypes, layout, offsets, token range and\n"
             "content hashes. Prints OK or one line per problem; exits 1 on problems.",
             "kilter prep validate", &positional))
    return 0;
  if (dir.empty()) throw po::error("prep validate needs the dataset directory: kilter prep validate DIR");
  std::vector<std::string> problems = io::validate_dataset(dir);
  if (problems.empty()) {
    io::DatasetIndex index = io::read_index_file(dir);
    std::printf("OK: %s: %zu shards, %llu documents, %llu tokens, vocab_size %u, eos_id %u, tokenizer %s\n",
                dir.c_str(), index.shards.size(), (unsigned long long)index.num_docs(),
                (unsigned long long)index.total_tokens(), index.vocab_size, index.eos_id,
                index.tokenizer.c_str());
    return 0;
  }
  std::printf("%zu problem%s in %s:\n", problems.size(), problems.size() == 1 ? "" : "s", dir.c_str());
  for (const std::string& problem : problems) std::printf("  %s\n", problem.c_str());
  return 1;
}

}  // namespace

int cmd_prep(int argc, char** argv) {
  // The help that fits the subcommand, for option errors.
  std::string help = "kilter prep --help";
  if (argc >= 2 && (!std::strcmp(argv[1], "synth") || !std::strcmp(argv[1], "validate")))
    help = std::string("kilter prep ") + argv[1] + " --help";
  else if (argc >= 2 && !std::strcmp(argv[1], "tokenizer"))
    help = "kilter prep tokenizer train --help";
  try {
    if (argc >= 2 && !std::strcmp(argv[1], "synth")) return prep_synth(argc - 1, argv + 1);
    if (argc >= 2 && !std::strcmp(argv[1], "validate")) return prep_validate(argc - 1, argv + 1);
    if (argc >= 3 && !std::strcmp(argv[1], "tokenizer") && !std::strcmp(argv[2], "train"))
      return prep_tokenizer_train(argc - 2, argv + 2);
    if (argc >= 2 && !std::strcmp(argv[1], "tokenizer")) {
      std::fprintf(stderr, "kilter prep tokenizer: expected `train` (see kilter prep tokenizer train --help)\n");
      return 2;
    }
    if (prep_is_import(argc, argv)) return prep_import(argc, argv);
    return prep_corpus(argc, argv);
  } catch (po::error& e) {
    const std::string message = program_options_message(e);
    if (message.find("--help") != std::string::npos)  // names its help already
      std::fprintf(stderr, "kilter prep: %s\n", message.c_str());
    else
      std::fprintf(stderr, "kilter prep: %s (see %s)\n", message.c_str(), help.c_str());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "kilter prep: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kilter prep: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace kilter::app

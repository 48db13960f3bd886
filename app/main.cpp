// kilter: the launcher. Picks the subcommand and hands over; all work happens in lib/ and io/.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "app/commands.h"
#include "io/did_you_mean.h"
#include "lib/backend/engine_probe.h"

namespace {

// One subcommand: what dispatch, the help and "did you mean" all read.
struct Command {
  const char* name;   // as the help shows it
  const char* alias;  // also accepted (nullptr: none)
  const char* help;   // one line
  int (*run)(int argc, char** argv);
};

const Command kCommands[] = {
    {"prep", nullptr, "text/JSONL/fortune files -> sharded HDF5 dataset (also: prep synth, prep validate)",
     kilter::app::cmd_prep},
    {"plan", nullptr, "dry-run of the balanced batch plan: statistics per world size", kilter::app::cmd_plan},
    {"train", nullptr, "data-parallel training (launch with mpirun or srun)", kilter::app::cmd_train},
    {"sample", nullptr, "generate text from a checkpoint (KV cache, CPU)", kilter::app::cmd_sample},
    {"export", nullptr, "a checkpoint as a Hugging Face GPT-2 directory (config.json, model.safetensors)",
     kilter::app::cmd_export},
    {"report", nullptr, "text summary and report.html of a run directory", kilter::app::cmd_report},
    {"bench-comm", nullptr, "allreduce benchmark, flat vs hierarchical (nccl-tests style)", kilter::app::cmd_bench_comm},
    {"--version", "version", "version and compiled backends", kilter::app::cmd_version},
};

void print_usage() {
  std::printf("usage: kilter <command> [options]   (kilter <command> --help lists every option)\n\ncommands:\n");
  for (const Command& c : kCommands) std::printf("  %-12s%s\n", c.name, c.help);
}

const Command* find_command(const std::string& word) {
  for (const Command& c : kCommands)
    if (word == c.name || (c.alias && word == c.alias)) return &c;
  return nullptr;
}

std::vector<std::string> command_names() {
  std::vector<std::string> names;
  for (const Command& c : kCommands) {
    names.emplace_back(c.name);
    if (c.alias) names.emplace_back(c.alias);
  }
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string word = argv[1];
  if (word == kilter::backend::kProbeSubcommand) return kilter::app::cmd_probe_engine(argc - 1, argv + 1);
  if (const Command* command = find_command(word)) return command->run(argc - 1, argv + 1);
  const std::string hint = kilter::did_you_mean_hint(word, command_names(), "kilter ");
  std::fprintf(stderr, "kilter: unknown command '%s'%s\n\n", word.c_str(), hint.c_str());
  print_usage();
  return 2;
}

// kilter: the launcher. Picks the subcommand and hands over; all work happens in lib/ and io/.
#include <cstdio>
#include <cstring>
#include <string>

#include "app/commands.h"
#include "io/did_you_mean.h"

static void print_usage() {
  std::printf(
      "usage: kilter <command> [options]   (kilter <command> --help lists every option)\n\n"
      "commands:\n"
      "  prep        text/JSONL/fortune files -> sharded HDF5 dataset (also: prep synth, prep validate)\n"
      "  plan        dry-run of the balanced batch plan: statistics per world size\n"
      "  train       data-parallel training (launch with mpirun or srun)\n"
      "  sample      generate text from a checkpoint (KV cache, CPU)\n"
      "  export      a checkpoint as a Hugging Face GPT-2 directory (config.json, model.safetensors)\n"
      "  report      text summary and report.html of a run directory\n"
      "  bench-comm  allreduce benchmark, flat vs hierarchical (nccl-tests style)\n"
      "  --version   version and compiled backends\n");
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") return kilter::app::cmd_version(argc - 1, argv + 1);
  if (cmd == "prep") return kilter::app::cmd_prep(argc - 1, argv + 1);
  if (cmd == "plan") return kilter::app::cmd_plan(argc - 1, argv + 1);
  if (cmd == "train") return kilter::app::cmd_train(argc - 1, argv + 1);
  if (cmd == "sample") return kilter::app::cmd_sample(argc - 1, argv + 1);
  if (cmd == "export") return kilter::app::cmd_export(argc - 1, argv + 1);
  if (cmd == "report") return kilter::app::cmd_report(argc - 1, argv + 1);
  if (cmd == "bench-comm") return kilter::app::cmd_bench_comm(argc - 1, argv + 1);
  const std::string hint = kilter::did_you_mean_hint(
      cmd, {"prep", "plan", "train", "sample", "report", "bench-comm", "version"}, "kilter ");
  std::fprintf(stderr, "kilter: unknown command '%s'%s\n\n", cmd.c_str(), hint.c_str());
  print_usage();
  return 2;
}

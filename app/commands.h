// One entry point per subcommand; argv[0] is the subcommand's name. Each returns the exit code.
#pragma once

namespace kilter::app {
int cmd_version(int argc, char** argv);
int cmd_prep(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_train(int argc, char** argv);
int cmd_report(int argc, char** argv);
int cmd_bench_comm(int argc, char** argv);
int cmd_sample(int argc, char** argv);
int cmd_export(int argc, char** argv);
// kilter's own, not in the help: one engine probe in a child process (lib/backend/engine_probe.h).
int cmd_probe_engine(int argc, char** argv);
// `kilter prep --format llmc|nanogpt|megatron|npy` (app/cmd_prep_import.cpp).
bool prep_is_import(int argc, char** argv);
int prep_import(int argc, char** argv);
}  // namespace kilter::app

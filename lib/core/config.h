// The run configuration: every key of the INI sections [model] [data] [train] [comm] [output],
// with its default and unit. Parsed with Boost.Program_options from a config file plus
// `--section.key=value` overrides; unknown keys and bad values are refused with the key named.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "io/text_format.h"
#include "lib/model/spec.h"

namespace boost { namespace program_options {
class options_description; class positional_options_description; class variables_map; class error;
template <class charT> class basic_parsed_options;
} }

namespace kilter {

struct DataConfig {
  std::string dir;                 // dataset directory (index.h5 + shards)
  std::string sources;             // weighted mixture "DIR:W, DIR:W, ..." (instead of dir; lib/balance/mixture.h)
  int64_t max_tokens = 2048;       // token budget of one micro-batch (padded tokens)
  int prefetch = 4;                // micro-batches read ahead per rank
  int reader_threads = 2;          // pread() worker threads per rank
  std::string sampler = "balanced";  // balanced | naive
  int naive_batch_size = 8;        // naive sampler: sequences per rank per micro-batch
  double eval_fraction = 0.0;      // share of documents held out for evaluation
  std::string tail = "drop";       // drop | redistribute: the last partial step of an epoch
  double cost_a = 1.0;             // cost model: a * tokens_computed + b * sum(L^2) + c * micro-batches
  double cost_b = -1.0;            // <0: default from the model shape
  double cost_c = -1.0;            // <0: default, 256 x cost_a on a GPU (balance::kDefaultMicroBatchTokens), 0 on the CPU
  double cost_t = -1.0;            // per earlier token a cut piece's later part exchanges (<0: from comm.link_gbps)
  bool cut_pieces = true;          // balanced sampler: cut pieces between ranks where it evens the step
  int64_t cut_cost_check = 10;     // steps of cut pieces after which training checks the derived cost_t (0: off)
  bool cut_cost_replan = false;    // where the check finds cuts dearer than charged: re-plan (true) or warn
  std::string cost_calibration = "auto";  // auto | off: fit the cost model and rank speeds in the run, re-plan with them
  std::string stage_dir;           // node-local directory to stage shards into ("" = read in place)
};

struct TrainConfig {
  int64_t steps = 100;             // total optimizer steps of the run
  int64_t tokens_per_step = 16384; // target tokens of one global step (all ranks together)
  double lr = 3e-4;                // peak learning rate
  double min_lr_ratio = 0.1;       // cosine decays to lr * min_lr_ratio
  int64_t warmup = 10;             // linear warmup steps
  double weight_decay = 0.1;       // AdamW, 2-D weights only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;          // global-norm clip (0: off)
  uint64_t seed = 1337;
  std::string precision = "fp32";  // fp32 | bf16 (bf16: CUDA backend)
  std::string backend = "auto";    // auto | cpu | cuda
  std::string attention = "auto";  // auto | cudnn | cublaslt (CUDA backend's attention engine)
  bool cuda_graphs = false;        // CUDA backend: replay micro-batch shapes as CUDA graphs
  std::string bf16_storage = "auto";  // auto | on | off: bf16 activations (precision bf16; CUDA datapath, CPU oracle)
  int threads = 1;                 // BLAS threads per rank
  int64_t eval_every = 0;          // evaluate every N steps (0: off)
  int64_t eval_batches = 8;        // micro-batches per rank in one evaluation
  std::string inject_delay;        // diagnostics drill: RANK:SECONDS[:PHASE]
  std::string on_nonfinite = "stop";  // stop | skip
  std::string init_from;           // HF GPT-2 directory or kilter checkpoint to start from ("": random init)
  std::string init_vocab = "strict";  // strict | resize: a vocabulary other than the dataset's
  bool shard_optimizer = true;     // alias of shard: true = optimizer, false = none (the parsers keep both in step)
  std::string shard = "optimizer"; // none | optimizer (ZeRO-1) | parameters (ZeRO-3 / FSDP)
  std::string shard_group = "world";  // node | world | N: ranks that shard one copy (HSDP when fewer than all)
  std::string grad_dtype = "auto";    // auto | fp32 | bf16: gradient accumulation buffer (auto: bf16 under bf16 storage)
  bool reshard_after_forward = true;  // parameters: free a unit's gathered parameters after its forward
  std::string recompute = "none";  // none | gelu | attention | block: activations the backward recomputes
};

struct CommConfig {
  std::string algo = "hierarchical";  // flat | hierarchical
  int ranks_per_node = 0;             // 0: from MPI_Comm_split_type(SHARED)
  double timeout_s = 300;             // watchdog: a collective slower than this ends the job
  double bucket_mb = 4.0;             // gradient bucket size for overlapped reduction
  bool overlap = true;                // reduce buckets while backward runs
  double link_gbps = 400;             // per-rank link of the K/V exchange of cut pieces (Gbit/s)
  double device_tflops = 0;           // sustained FLOP rate of one rank (TFLOP/s), turns link time into plan cost;
                                      // 0 (auto): the backend's, balance::device_tflops()
};

struct OutputConfig {
  std::string dir = "runs/kilter";
  int64_t log_every = 10;
  int64_t checkpoint_every = 0;      // 0: only at the end of the run or on a signal
  double checkpoint_minutes = 30;    // also when this many minutes passed since the last (0: off)
  int keep_checkpoints = 3;
  int64_t trace_steps = 50;          // steps recorded in trace/rank-N.json (0: none)
  bool tensorboard = true;           // TensorBoard event files under RUN_DIR/tensorboard/
  double stall_factor = 2.0;         // a step slower than this times the median is a stall
  int64_t sample_every = 0;          // rank 0 prints a generated sample every N steps (0: off)
  int sample_tokens = 64;            // new tokens per sample
  double sample_temperature = 0.8;   // 0: greedy
  std::string sample_prompt;         // "" : start from the EOS id
};

struct Config {
  model::ModelSpec model;  // the [model] section: the one model description (lib/model/spec.h)
  DataConfig data;
  TrainConfig train;
  CommConfig comm;
  OutputConfig output;

  // Resolved INI text (every key, with the values in force), written to RUN_DIR/config.ini.
  std::string to_ini() const;
  // FNV-1a hash of the keys that must agree across ranks and across a resume.
  uint64_t hash() const;
  // Checks ranges and enum values; throws kilter::Error naming the key.
  void validate() const;
};

// train.shard_group resolved at a world size of `world_size` ranks, `ranks_per_node` per node:
// the ranks per shard group G (world: all, node: a node's, N: N). Throws kilter::Error naming the
// key when G does not divide the world size (or the node's ranks do not).
int shard_group_size(const TrainConfig& train, int world_size, int ranks_per_node);

// train.grad_dtype resolved: "fp32" or "bf16" (auto: bf16 where bf16_storage_in_force).
std::string resolved_grad_dtype(const TrainConfig& train, bool bf16_storage_in_force);

// Adds every key as `section.key` with its default, bound to cfg's fields.
void add_config_options(boost::program_options::options_description& desc, Config& cfg);

// Parses a subcommand's argv (argv[0] = subcommand name): `--config FILE` (an INI file, when
// given) and `--section.key=value` overrides, which win over the file. `extra` describes the
// subcommand's own flags (e.g. --resume, --json); their values are left in `vm`. Returns false
// when --help was asked (the help text has been printed to stdout). Throws kilter::Error for
// unknown keys and bad values, naming them.
bool parse_command_line(int argc, char** argv, const std::string& usage,
                        boost::program_options::options_description& extra,
                        boost::program_options::variables_map& vm, Config& cfg);

// The message of a Boost.Program_options error, safe for any user text (Boost's own what() loops
// forever on an option name or value that holds one of its %placeholders%).
std::string program_options_message(boost::program_options::error& e);

// Boost.Program_options' parser style without prefix guessing: `--train.step` is not taken for
// train.steps, nor `--world` for --world-size. Every subcommand parses with it.
int exact_option_style();

// Parses a subcommand's argv with exact names (exact_option_style()). An unknown option becomes a
// program_options error whose message names it, suggests the nearest option ("did you mean") and
// points at `help_command --help`.
boost::program_options::basic_parsed_options<char> parse_exact(
    int argc, char** argv, const boost::program_options::options_description& desc, const std::string& help_command,
    const boost::program_options::positional_options_description* positional = nullptr);

// "unknown option --NAME; did you mean --X? (CMD --help lists every option)"; for a world-size
// option that the command lacks, that the launcher sets it.
std::string unknown_option_message(const std::string& option, const boost::program_options::options_description& desc,
                                   const std::string& help_command);
// "unknown key KEY; did you mean X ([section] key)?" for an INI file.
std::string unknown_key_message(const std::string& key, const boost::program_options::options_description& desc);

// Parses an INI file into cfg (keys absent from the file keep their defaults).
Config parse_config_file(const std::string& path);

// "section.key" -> value pairs of an INI text (io/text_format.h).
using io::ini_entries;

// Parse an INI text (the resolved config of a run directory) into a Config.
Config config_from_ini_text(const std::string& text);

// Parses `data.sources`: "DIR:W, DIR:W, ..." (spaces allowed) into (dir, weight) with the weights
// normalized to sum 1 (lib/balance/mixture.h draws from them). Throws kilter::Error naming
// data.sources: an entry without ":W", a weight that is not a positive number, a directory given twice.
std::vector<std::pair<std::string, double>> parse_data_sources(const std::string& text);

}  // namespace kilter

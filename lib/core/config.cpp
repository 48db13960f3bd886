// Config keys, defaults, parsing and validation (see config.h).
#include "lib/core/config.h"

#include <boost/lexical_cast.hpp>
#include <algorithm>
#include <boost/program_options.hpp>
#include <charconv>
#include <fstream>
#include <set>
#include <cmath>
#include <map>
#include <iostream>
#include <sstream>
#include <type_traits>

#include "io/did_you_mean.h"
#include "io/base/error.h"

namespace po = boost::program_options;

namespace kilter {

namespace {
// A default as `--help` and config.ini show it: the shortest text that reads back as the same
// value (0.0003, not Boost's 17-digit 0.00029999999999999997).
template <class T>
std::string shortest_text(const T& value) {
  if constexpr (std::is_floating_point_v<T>) {
    // The shortest text that reads back exactly, in plain decimals when that stays short
    // (0.0003 rather than 3e-04), else in the shortest form (1e-08).
    char text[400];
    const auto fixed = std::to_chars(text, text + sizeof text, value, std::chars_format::fixed);
    if (fixed.ec == std::errc() && fixed.ptr - text <= 8) return std::string(text, fixed.ptr);
    const auto shortest = std::to_chars(text, text + sizeof text, value);
    return std::string(text, shortest.ptr);
  } else
    return boost::lexical_cast<std::string>(value);
}
}  // namespace

void add_config_options(po::options_description& desc, Config& c) {
  auto& m = c.model;
  auto& d = c.data;
  auto& t = c.train;
  auto& k = c.comm;
  auto& o = c.output;
  // The [model] section: the model's settings table (io/model_settings.h), in its order.
  io::for_each_model_setting(m, [&](const io::ModelSettingInfo& key, auto& value) {
    desc.add_options()(("model." + std::string(key.name)).c_str(),
                       po::value(&value)->default_value(value, shortest_text(value)), key.help);
  });
  // clang-format off
  desc.add_options()
    ("data.dir", po::value(&d.dir)->default_value(d.dir, shortest_text(d.dir)), "dataset directory (index.h5 + shard-*.h5)")
    ("data.sources", po::value(&d.sources)->default_value(d.sources, shortest_text(d.sources)), "weighted mixture of datasets instead of data.dir: DIR:W, DIR:W, ... (weights normalized; each step draws from every source by weight, sources wrap independently)")
    ("data.max_tokens", po::value(&d.max_tokens)->default_value(d.max_tokens, shortest_text(d.max_tokens)), "token budget of a micro-batch, padding included (tokens)")
    ("data.prefetch", po::value(&d.prefetch)->default_value(d.prefetch, shortest_text(d.prefetch)), "micro-batches read ahead per rank")
    ("data.reader_threads", po::value(&d.reader_threads)->default_value(d.reader_threads, shortest_text(d.reader_threads)), "reader worker threads per rank")
    ("data.sampler", po::value(&d.sampler)->default_value(d.sampler, shortest_text(d.sampler)), "balanced | naive")
    ("data.naive_batch_size", po::value(&d.naive_batch_size)->default_value(d.naive_batch_size, shortest_text(d.naive_batch_size)), "naive sampler: sequences per rank per micro-batch")
    ("data.eval_fraction", po::value(&d.eval_fraction)->default_value(d.eval_fraction, shortest_text(d.eval_fraction)), "share of documents held out for evaluation (0..0.5)")
    ("data.tail", po::value(&d.tail)->default_value(d.tail, shortest_text(d.tail)), "last partial step of an epoch: drop | redistribute")
    ("data.cost_a", po::value(&d.cost_a)->default_value(d.cost_a, shortest_text(d.cost_a)), "cost model: weight of computed tokens")
    ("data.cost_b", po::value(&d.cost_b)->default_value(d.cost_b, shortest_text(d.cost_b)), "cost model: weight of sum(L^2) (<0: derived from the model shape)")
    ("data.cost_c", po::value(&d.cost_c)->default_value(d.cost_c, shortest_text(d.cost_c)), "cost model: fixed cost of one micro-batch, in the unit of cost_a per token (<0: 256 x cost_a on a GPU, 0 on the CPU backend)")
    ("data.cost_t", po::value(&d.cost_t)->default_value(d.cost_t, shortest_text(d.cost_t)), "cost model: per earlier token whose K/V a cut piece's later part receives, in the unit of cost_a per token (<0: from the model shape, comm.link_gbps and comm.device_tflops, raised where the link sets the pace at this world size and train.tokens_per_step)")
    ("data.cut_pieces", po::value(&d.cut_pieces)->default_value(d.cut_pieces, shortest_text(d.cut_pieces)), "balanced sampler: cut pieces between ranks where that lowers the busiest rank's cost (pieces longer than data.max_tokens are always cut)")
    ("data.cut_cost_check", po::value(&d.cut_cost_check)->default_value(d.cut_cost_check, shortest_text(d.cut_cost_check)), "training: after this many steps (past the first two), measure what cut pieces cost from the K/V exchange's waits and say whether the derived data.cost_t held: above 1.5 x and costing a rank that received K/V >= 2% of its step, it did not (0: never check; a given data.cost_t is never checked)")
    ("data.cut_cost_replan", po::value(&d.cut_cost_replan)->default_value(d.cut_cost_replan, shortest_text(d.cut_cost_replan)), "training: where the cut-cost check finds that the charge did not hold, plan the rest of the run with the measured charge (its division among the ranks then depends on its timings: not bit-reproducible) instead of only warning")
    ("data.cost_calibration", po::value(&d.cost_calibration)->default_value(d.cost_calibration, shortest_text(d.cost_calibration)), "training: auto | off. auto: rank 0 fits the cost model (data.cost_b, cost_c, and cost_t where pieces are cut; those pinned >= 0 stay) and each rank's speed to the measured compute times over a window of the latest steps (at most 320; fitted 20 steps after warm-up and after a switch, then after 40, 80, ... more while the plan is kept), and where the division made with the fit beats the one in force by more than the fit's noise, every rank re-plans the remaining steps with it (same steps and tokens, other division; the fitted models go into checkpoints and summary.json; two runs may differ in the last bits). off: the configured cost model throughout (bit-reproducible)")
    ("data.stage_dir", po::value(&d.stage_dir)->default_value(d.stage_dir, shortest_text(d.stage_dir)), "node-local directory to stage shards into (empty: read in place)")
    ("train.steps", po::value(&t.steps)->default_value(t.steps, shortest_text(t.steps)), "total optimizer steps of the run")
    ("train.tokens_per_step", po::value(&t.tokens_per_step)->default_value(t.tokens_per_step, shortest_text(t.tokens_per_step)), "target tokens per global step, all ranks together")
    ("train.lr", po::value(&t.lr)->default_value(t.lr, shortest_text(t.lr)), "peak learning rate")
    ("train.min_lr_ratio", po::value(&t.min_lr_ratio)->default_value(t.min_lr_ratio, shortest_text(t.min_lr_ratio)), "final learning rate / peak (cosine)")
    ("train.warmup", po::value(&t.warmup)->default_value(t.warmup, shortest_text(t.warmup)), "linear warmup (steps)")
    ("train.weight_decay", po::value(&t.weight_decay)->default_value(t.weight_decay, shortest_text(t.weight_decay)), "AdamW decoupled weight decay (2-D weights only)")
    ("train.beta1", po::value(&t.beta1)->default_value(t.beta1, shortest_text(t.beta1)), "AdamW beta1")
    ("train.beta2", po::value(&t.beta2)->default_value(t.beta2, shortest_text(t.beta2)), "AdamW beta2")
    ("train.eps", po::value(&t.eps)->default_value(t.eps, shortest_text(t.eps)), "AdamW epsilon")
    ("train.grad_clip", po::value(&t.grad_clip)->default_value(t.grad_clip, shortest_text(t.grad_clip)), "global gradient-norm clip (0: off)")
    ("train.seed", po::value(&t.seed)->default_value(t.seed, shortest_text(t.seed)), "seed of initialization and data order")
    ("train.precision", po::value(&t.precision)->default_value(t.precision, shortest_text(t.precision)), "fp32 | bf16 (bf16 GEMM inputs, fp32 accumulation and weights; on the cpu backend it needs AVX512_BF16 or AMX)")
    ("train.backend", po::value(&t.backend)->default_value(t.backend, shortest_text(t.backend)), "auto | cpu | cuda")
    ("train.attention", po::value(&t.attention)->default_value(t.attention, shortest_text(t.attention)), "CUDA attention engine: auto (train.precision=bf16: cuDNN SDPA flash attention on the packed pieces where its self-check passes; else cuDNN when usable, else cuBLASLt) | sdpa (bf16 attention, also under fp32) | cudnn | cublaslt")
    ("train.cuda_graphs", po::value(&t.cuda_graphs)->default_value(t.cuda_graphs, shortest_text(t.cuda_graphs)), "replay each micro-batch shape as CUDA graphs (cuda backend, cuBLASLt attention shapes)")
    ("train.bf16_storage", po::value(&t.bf16_storage)->default_value(t.bf16_storage, shortest_text(t.bf16_storage)), "with train.precision = bf16, store activations in bf16: auto (the cuda backend does where a self-check against the CPU oracle passes at start-up, else keeps them fp32 and says so) | on | off (fp32 activations, bf16 GEMM math); on the cpu backend, on runs the oracle of the cuda datapath")
    ("train.threads", po::value(&t.threads)->default_value(t.threads, shortest_text(t.threads)), "BLAS threads per rank")
    ("train.eval_every", po::value(&t.eval_every)->default_value(t.eval_every, shortest_text(t.eval_every)), "evaluate on the held-out split every N steps (0: off)")
    ("train.eval_batches", po::value(&t.eval_batches)->default_value(t.eval_batches, shortest_text(t.eval_batches)), "micro-batches per rank in one evaluation")
    ("train.inject_delay", po::value(&t.inject_delay)->default_value(t.inject_delay, shortest_text(t.inject_delay)), "diagnostics drill: RANK:SECONDS[:PHASE] makes one rank slow on purpose (SECONDS once per step in PHASE, default forward); RANK:SHARE%[:PHASE] makes it SHARE% slower on all its work (that share of each forward and backward, or of PHASE)")
    ("train.on_nonfinite", po::value(&t.on_nonfinite)->default_value(t.on_nonfinite, shortest_text(t.on_nonfinite)), "non-finite loss or gradient norm: stop | skip")
    ("train.init_from", po::value(&t.init_from)->default_value(t.init_from, shortest_text(t.init_from)), "start from these weights: a Hugging Face directory (config.json + model.safetensors: GPT-2, Llama, Qwen2 or Mistral; its config must match the run's model.* keys) or a kilter checkpoint (file or run directory); optimizer state and data position start fresh (empty: random init)")
    ("train.init_vocab", po::value(&t.init_vocab)->default_value(t.init_vocab, shortest_text(t.init_vocab)), "init_from weights whose vocabulary differs from the dataset's: strict (refuse) | resize (keep the first embedding rows, initialize the rest)")
    ("train.shard_optimizer", po::value(&t.shard_optimizer)->default_value(t.shard_optimizer, shortest_text(t.shard_optimizer)), "alias of train.shard: true = optimizer, false = none (refused where it contradicts an explicit train.shard)")
    ("train.shard", po::value(&t.shard)->default_value(t.shard, shortest_text(t.shard)), "none (every rank holds the whole model state) | optimizer (ZeRO-1: gradients are reduce-scattered, each rank keeps the AdamW moments of 1/G of the parameters and updates them, the parameters are all-gathered) | parameters (ZeRO-3 / FSDP: each rank also holds only 1/G of the parameters and gradients; a unit's parameters are gathered before its forward and backward and freed after; cpu backend). G: train.shard_group; no effect on 1 rank")
    ("train.shard_group", po::value(&t.shard_group)->default_value(t.shard_group, shortest_text(t.shard_group)), "ranks that share one sharded copy of the model state: world (all) | node (a node's ranks: HSDP, each shard all-reduced across nodes) | N (N ranks, must divide the world size)")
    ("train.grad_dtype", po::value(&t.grad_dtype)->default_value(t.grad_dtype, shortest_text(t.grad_dtype)), "precision of the gradient accumulation buffer: auto (bf16 under bf16 storage, else fp32) | fp32 | bf16 (reduced in fp32)")
    ("train.reshard_after_forward", po::value(&t.reshard_after_forward)->default_value(t.reshard_after_forward, shortest_text(t.reshard_after_forward)), "train.shard = parameters: free a unit's gathered parameters after its forward and gather them again for its backward (false: keep them through the backward, more memory, one gather less)")
    ("train.recompute", po::value(&t.recompute)->default_value(t.recompute, shortest_text(t.recompute)), "activations the forward drops and the backward recomputes: none | gelu (the MLP's GELU output) | attention (the saved softmax) | block (all but each block's input); gradients bit-identical to none on the cpu backend, equal to float rounding on cuda")
    ("comm.algo", po::value(&k.algo)->default_value(k.algo, shortest_text(k.algo)), "gradient reduction: flat | hierarchical")
    ("comm.ranks_per_node", po::value(&k.ranks_per_node)->default_value(k.ranks_per_node, shortest_text(k.ranks_per_node)), "ranks per node (0: detect; set it to stand one machine in for several nodes)")
    ("comm.timeout_s", po::value(&k.timeout_s)->default_value(k.timeout_s, shortest_text(k.timeout_s)), "a collective not done within this many seconds ends the job (s)")
    ("comm.bucket_mb", po::value(&k.bucket_mb)->default_value(k.bucket_mb, shortest_text(k.bucket_mb)), "gradient bucket size (MiB)")
    ("comm.overlap", po::value(&k.overlap)->default_value(k.overlap, shortest_text(k.overlap)), "reduce gradient buckets while backward runs")
    ("comm.link_gbps", po::value(&k.link_gbps)->default_value(k.link_gbps, shortest_text(k.link_gbps)), "per-rank link rate of the K/V exchange of cut pieces (Gbit/s; InfiniBand NDR, one port per GPU: 400; HDR: 200)")
    ("comm.device_tflops", po::value(&k.device_tflops)->default_value(k.device_tflops, shortest_text(k.device_tflops)), "sustained rate of one rank (TFLOP/s; the plan's transfer cost). 0 (auto): the backend's, a GPU 400 (H100 bf16), the CPU backend 0.1 per train.threads")
    ("output.dir", po::value(&o.dir)->default_value(o.dir, shortest_text(o.dir)), "run directory")
    ("output.log_every", po::value(&o.log_every)->default_value(o.log_every, shortest_text(o.log_every)), "progress line every N steps")
    ("output.checkpoint_every", po::value(&o.checkpoint_every)->default_value(o.checkpoint_every, shortest_text(o.checkpoint_every)), "checkpoint every N steps (0: at the end and on signals only)")
    ("output.checkpoint_minutes", po::value(&o.checkpoint_minutes)->default_value(o.checkpoint_minutes, shortest_text(o.checkpoint_minutes)), "also checkpoint when this many minutes passed since the last one (0: off); signals always checkpoint")
    ("output.keep_checkpoints", po::value(&o.keep_checkpoints)->default_value(o.keep_checkpoints, shortest_text(o.keep_checkpoints)), "checkpoints kept in RUN_DIR/checkpoints")
    ("output.trace_steps", po::value(&o.trace_steps)->default_value(o.trace_steps, shortest_text(o.trace_steps)), "steps recorded in the Chrome trace (0: none)")
    ("output.tensorboard", po::value(&o.tensorboard)->default_value(o.tensorboard, shortest_text(o.tensorboard)), "write TensorBoard event files under RUN_DIR/tensorboard/: rank 0 the step scalars (loss, lr, grad norm, tokens/s, MFU, balance, eval loss), each rank its phase seconds (tensorboard/rank-NNNNN/), every output.log_every steps")
    ("output.stall_factor", po::value(&o.stall_factor)->default_value(o.stall_factor, shortest_text(o.stall_factor)), "steps slower than this times the median are reported as stalls")
    ("output.sample_every", po::value(&o.sample_every)->default_value(o.sample_every, shortest_text(o.sample_every)), "rank 0 prints a generated sample every N steps (0: off; CPU, KV cache)")
    ("output.sample_tokens", po::value(&o.sample_tokens)->default_value(o.sample_tokens, shortest_text(o.sample_tokens)), "new tokens per training sample (stops early at EOS or the context)")
    ("output.sample_temperature", po::value(&o.sample_temperature)->default_value(o.sample_temperature, shortest_text(o.sample_temperature)), "temperature of training samples (0: greedy); seed = train.seed + step")
    ("output.sample_prompt", po::value(&o.sample_prompt)->default_value(o.sample_prompt, shortest_text(o.sample_prompt)), "prompt of training samples (empty: a new document, its first token drawn from the training documents' first tokens)");
  // clang-format on
}

static void check_one_of(const std::string& key, const std::string& v,
                         std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (v == a) return;
    if (!list.empty()) list += " | ";
    list += a;
  }
  KILTER_USER_FAIL("config key " << key << " = '" << v << "': expected " << list
                                   << did_you_mean_hint(v, std::vector<std::string>(allowed.begin(), allowed.end())));
}

#define KILTER_CHECK_KEY(cond, key, value, what) \
  KILTER_USER_CHECK(cond, "config key " << key << " = " << (value) << ": " << what)

// The [model] section (lib/model/spec.h): sizes, the architecture and its keys.
static void validate_model(const model::ModelSpec& model) {
  KILTER_CHECK_KEY(model.n_layer >= 1, "model.n_layer", model.n_layer, "must be >= 1");
  KILTER_CHECK_KEY(model.n_head >= 1, "model.n_head", model.n_head, "must be >= 1");
  KILTER_CHECK_KEY(model.n_embd >= 1 && model.n_embd % model.n_head == 0, "model.n_embd",
                   model.n_embd, "must be a positive multiple of model.n_head");
  KILTER_CHECK_KEY(model.block_size >= 2, "model.block_size", model.block_size, "must be >= 2");
  KILTER_CHECK_KEY(model.vocab_size >= 0, "model.vocab_size", model.vocab_size, "must be >= 0");
  check_one_of("model.arch", model.arch, {"gpt2", "llama"});
  KILTER_CHECK_KEY(model.n_kv_head >= 0 && model.n_head % model.kv_heads() == 0, "model.n_kv_head", model.n_kv_head,
                   "must divide model.n_head = " << model.n_head << " (0: as many as n_head)");
  KILTER_CHECK_KEY(model.llama() || model.kv_heads() == model.n_head, "model.n_kv_head", model.n_kv_head,
                   "grouped-query attention is for model.arch = llama (gpt2's c_attn holds as many K/V heads as "
                   "query heads)");
  KILTER_CHECK_KEY(!model.llama() || model.head_dim() % 2 == 0, "model.n_embd", model.n_embd,
                   "with model.arch = llama, n_embd / n_head (the head size, " << model.head_dim()
                   << ") must be even: RoPE turns pairs of columns");
  KILTER_CHECK_KEY(model.ffn_hidden >= 0, "model.ffn_hidden", model.ffn_hidden, "must be >= 0 (0: the default)");
  KILTER_CHECK_KEY(model.norm_eps > 0, "model.norm_eps", model.norm_eps, "must be > 0");
  check_one_of("model.tie_embeddings", model.tie_embeddings, {"auto", "true", "false"});
  check_one_of("model.rope_scaling", model.rope_scaling, {"none", "llama3"});
  KILTER_CHECK_KEY(model.rope_theta > 0, "model.rope_theta", model.rope_theta, "must be > 0");
  KILTER_CHECK_KEY(model.rope_scaling != "llama3" ||
                       (model.rope_factor > 0 && model.rope_low_freq_factor > 0 &&
                        model.rope_high_freq_factor > model.rope_low_freq_factor && model.rope_original_context > 0),
                   "model.rope_scaling", model.rope_scaling,
                   "needs model.rope_factor > 0, 0 < model.rope_low_freq_factor < model.rope_high_freq_factor and "
                   "model.rope_original_context > 0");
  KILTER_CHECK_KEY(model.llama() || model.rope_scaling == "none", "model.rope_scaling", model.rope_scaling,
                   "is a key of model.arch = llama (gpt2 has learned positions)");
  KILTER_CHECK_KEY(model.llama() || !model.qkv_bias, "model.qkv_bias", "true",
                   "is a key of model.arch = llama (gpt2 has biases everywhere already)");
}

void Config::validate() const {
  validate_model(model);
  // A context longer than a micro-batch is cut over ranks (balanced sampler; the plan checks the
  // world size); the naive sampler cannot cut.
  KILTER_CHECK_KEY(data.max_tokens >= 1, "data.max_tokens", data.max_tokens, "must be >= 1");
  KILTER_CHECK_KEY(data.max_tokens >= model.block_size || data.sampler != "naive", "data.max_tokens", data.max_tokens,
                   "is smaller than the context model.block_size = " << model.block_size
                   << " with data.sampler = naive, which cannot cut a piece between ranks; raise data.max_tokens, "
                   "lower model.block_size or use data.sampler = balanced");
  KILTER_CHECK_KEY(data.prefetch >= 1, "data.prefetch", data.prefetch, "must be >= 1");
  KILTER_CHECK_KEY(data.reader_threads >= 1, "data.reader_threads", data.reader_threads, "must be >= 1");
  check_one_of("data.sampler", data.sampler, {"balanced", "naive"});
  KILTER_CHECK_KEY(data.naive_batch_size >= 1, "data.naive_batch_size", data.naive_batch_size, "must be >= 1");
  KILTER_CHECK_KEY(data.eval_fraction >= 0 && data.eval_fraction <= 0.5, "data.eval_fraction",
                   data.eval_fraction, "must be in [0, 0.5]");
  check_one_of("data.tail", data.tail, {"drop", "redistribute"});
  check_one_of("data.cost_calibration", data.cost_calibration, {"auto", "off"});
  KILTER_CHECK_KEY(data.cost_a >= 0, "data.cost_a", data.cost_a, "must be >= 0");
  KILTER_CHECK_KEY(data.cut_cost_check >= 0, "data.cut_cost_check", data.cut_cost_check,
                   "must be >= 0 (0: never check what cut pieces cost)");
  KILTER_CHECK_KEY(train.steps >= 1, "train.steps", train.steps, "must be >= 1");
  KILTER_CHECK_KEY(train.tokens_per_step >= 1, "train.tokens_per_step", train.tokens_per_step,
                   "a step must hold at least one token (e.g. " << 8 * data.max_tokens << ")");
  KILTER_CHECK_KEY(data.cost_a > 0 || data.cost_b != 0, "data.cost_a", data.cost_a,
                   "with data.cost_b = 0 the cost model is empty: give cost_a > 0 or cost_b != 0");
  KILTER_CHECK_KEY(train.lr > 0, "train.lr", train.lr, "must be > 0");
  KILTER_CHECK_KEY(train.min_lr_ratio >= 0 && train.min_lr_ratio <= 1, "train.min_lr_ratio", train.min_lr_ratio, "must be in [0, 1]");
  KILTER_CHECK_KEY(train.warmup >= 0, "train.warmup", train.warmup, "must be >= 0");
  KILTER_CHECK_KEY(train.weight_decay >= 0, "train.weight_decay", train.weight_decay, "must be >= 0");
  KILTER_CHECK_KEY(train.beta1 >= 0 && train.beta1 < 1, "train.beta1", train.beta1, "must be in [0, 1)");
  KILTER_CHECK_KEY(train.beta2 >= 0 && train.beta2 < 1, "train.beta2", train.beta2, "must be in [0, 1)");
  KILTER_CHECK_KEY(train.eps > 0, "train.eps", train.eps, "must be > 0");
  KILTER_CHECK_KEY(train.grad_clip >= 0, "train.grad_clip", train.grad_clip, "must be >= 0");
  check_one_of("train.precision", train.precision, {"fp32", "bf16"});
  check_one_of("train.backend", train.backend, {"auto", "cpu", "cuda"});
  check_one_of("train.attention", train.attention, {"auto", "sdpa", "cudnn", "cublaslt"});
  check_one_of("train.recompute", train.recompute, {"none", "gelu", "attention", "block"});
  check_one_of("train.bf16_storage", train.bf16_storage, {"auto", "on", "off"});
  check_one_of("train.shard", train.shard, {"none", "optimizer", "parameters"});
  KILTER_CHECK_KEY(train.shard_group == "node" || train.shard_group == "world" ||
                       (!train.shard_group.empty() && train.shard_group.find_first_not_of("0123456789") == std::string::npos &&
                        train.shard_group.size() < 8 && std::stoi(train.shard_group) >= 1),
                   "train.shard_group", "'" + train.shard_group + "'",
                   "expected node | world | N (a positive number of ranks that divides the world size)");
  check_one_of("train.grad_dtype", train.grad_dtype, {"auto", "fp32", "bf16"});
  KILTER_USER_CHECK(train.bf16_storage != "on" || train.precision == "bf16",
                    "train.bf16_storage = on needs train.precision = bf16 (got " << train.precision
                                                                                 << "); use bf16 or leave bf16_storage at auto");
  KILTER_CHECK_KEY(train.threads >= 1, "train.threads", train.threads, "must be >= 1");
  KILTER_CHECK_KEY(train.eval_every >= 0, "train.eval_every", train.eval_every, "must be >= 0");
  KILTER_CHECK_KEY(train.eval_every == 0 || data.eval_fraction > 0, "train.eval_every", train.eval_every,
                   "needs held-out documents, but data.eval_fraction = 0: set data.eval_fraction (e.g. 0.05) "
                   "or train.eval_every = 0");
  KILTER_CHECK_KEY(train.eval_batches >= 1, "train.eval_batches", train.eval_batches, "must be >= 1");
  check_one_of("train.on_nonfinite", train.on_nonfinite, {"stop", "skip"});
  check_one_of("train.init_vocab", train.init_vocab, {"strict", "resize"});
  KILTER_USER_CHECK(data.sources.empty() || data.dir.empty(),
               "config keys data.dir and data.sources are both set: give one (data.dir is the one-source case)");
  if (!data.sources.empty()) parse_data_sources(data.sources);  // refused here, naming the key
  KILTER_USER_CHECK(data.sources.empty() || data.stage_dir.empty(),
                    "config keys data.sources and data.stage_dir are both set: staging a mixture is not supported "
                    "yet; leave data.stage_dir empty to read the sources in place");
  check_one_of("comm.algo", comm.algo, {"flat", "hierarchical"});
  KILTER_CHECK_KEY(comm.ranks_per_node >= 0, "comm.ranks_per_node", comm.ranks_per_node, "must be >= 0");
  KILTER_CHECK_KEY(comm.timeout_s > 0, "comm.timeout_s", comm.timeout_s, "must be > 0");
  KILTER_CHECK_KEY(comm.bucket_mb > 0, "comm.bucket_mb", comm.bucket_mb, "must be > 0");
  KILTER_CHECK_KEY(comm.link_gbps > 0, "comm.link_gbps", comm.link_gbps, "must be > 0");
  KILTER_CHECK_KEY(comm.device_tflops >= 0, "comm.device_tflops", comm.device_tflops, "must be >= 0 (0: auto)");
  KILTER_CHECK_KEY(output.log_every >= 1, "output.log_every", output.log_every, "must be >= 1");
  KILTER_CHECK_KEY(output.checkpoint_every >= 0, "output.checkpoint_every", output.checkpoint_every, "must be >= 0");
  KILTER_CHECK_KEY(output.checkpoint_minutes >= 0, "output.checkpoint_minutes", output.checkpoint_minutes, "must be >= 0");
  KILTER_CHECK_KEY(output.keep_checkpoints >= 1, "output.keep_checkpoints", output.keep_checkpoints, "must be >= 1");
  KILTER_CHECK_KEY(output.trace_steps >= 0, "output.trace_steps", output.trace_steps, "must be >= 0");
  KILTER_CHECK_KEY(output.stall_factor > 1, "output.stall_factor", output.stall_factor, "must be > 1");
  KILTER_CHECK_KEY(output.sample_every >= 0, "output.sample_every", output.sample_every, "must be >= 0");
  KILTER_CHECK_KEY(output.sample_tokens >= 1, "output.sample_tokens", output.sample_tokens, "must be >= 1");
  KILTER_CHECK_KEY(output.sample_temperature >= 0, "output.sample_temperature", output.sample_temperature, "must be >= 0");
}

// Renders every key with the value in force, grouped by section.
std::string Config::to_ini() const {
  Config copy = *this;
  po::options_description desc;
  add_config_options(desc, copy);
  std::ostringstream os;
  std::string section;
  for (const auto& opt : desc.options()) {
    const std::string& name = opt->long_name();
    auto dot = name.find('.');
    std::string sec = name.substr(0, dot);
    if (sec != section) {
      os << (section.empty() ? "" : "\n") << "[" << sec << "]\n";
      section = sec;
    }
    // desc was built from `copy`, so each key's default is the value in force; format_parameter()
    // renders it as "arg (=VALUE)".
    os << name.substr(dot + 1) << " = ";
    std::string fp = opt->format_parameter();
    auto p = fp.find("(=");
    if (p != std::string::npos) os << fp.substr(p + 2, fp.size() - p - 3);
    os << "\n";
  }
  return os.str();
}

std::vector<std::pair<std::string, double>> parse_data_sources(const std::string& text) {
  std::vector<std::pair<std::string, double>> sources;
  std::set<std::string> seen;
  double sum = 0;
  std::istringstream is(text);
  for (std::string item; std::getline(is, item, ',');) {
    const auto trim = [](std::string s) {
      const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
      return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
    };
    item = trim(item);
    const size_t colon = item.rfind(':');
    KILTER_USER_CHECK(colon != std::string::npos && colon > 0,
                 "config key data.sources: '" << item << "' is not DIR:WEIGHT (e.g. data/web:0.7, data/code:0.3)");
    const std::string dir = trim(item.substr(0, colon)), weight_text = trim(item.substr(colon + 1));
    double weight = 0;
    size_t used = 0;
    try {
      weight = std::stod(weight_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KILTER_USER_CHECK(used > 0 && used == weight_text.size() && std::isfinite(weight) && weight > 0,
                 "config key data.sources: the weight of " << dir << " ('" << weight_text
                                                           << "') is not a positive number");
    KILTER_USER_CHECK(seen.insert(dir).second, "config key data.sources: " << dir << " is listed twice");
    sources.emplace_back(dir, weight);
    sum += weight;
  }
  KILTER_USER_CHECK(!sources.empty(), "config key data.sources is empty: give DIR:WEIGHT, DIR:WEIGHT, ...");
  for (auto& s : sources) s.second /= sum;
  return sources;
}

// data.sources without its paths: "0.7,0.2,0.1" (the weights change the numbers; where the
// datasets lie does not, as for data.dir).
static std::string mixture_weights_only(const std::string& sources) {
  std::string out, item;
  std::istringstream is(sources);
  while (std::getline(is, item, ',')) out += (out.empty() ? "" : ",") + item.substr(item.rfind(':') + 1);
  return out;
}

// The [model] keys added with the model description of architectures (since = later in
// io/model_settings.h): at their defaults (a gpt2 run) they stay out of the hash, so that a
// checkpoint written before they existed resumes; set otherwise, they change the numbers and count.
static std::string without_default_model_keys(const std::string& ini) {
  const model::ModelSpec defaults;
  std::map<std::string, std::string> later;
  io::for_each_model_setting(defaults, [&](const io::ModelSettingInfo& key, const auto& value) {
    if (key.later) later[key.name] = shortest_text(value);
  });
  std::istringstream in(ini);
  std::string out, line, section;
  while (std::getline(in, line)) {
    if (!line.empty() && line.front() == '[') section = line;
    const size_t eq = line.find(" = ");
    if (section == "[model]" && eq != std::string::npos) {
      const auto key = later.find(line.substr(0, eq));
      if (key != later.end() && line.substr(eq + 3) == key->second) continue;
    }
    // Train keys added after checkpoints existed, at their defaults (the hash clears them).
    if (section == "[train]" && line == "bf16_storage = auto") continue;
    if (section == "[train]" && (line == "shard = optimizer" || line == "shard_group = world" ||
                                 line == "grad_dtype = auto" || line == "reshard_after_forward = 1"))
      continue;
    out += line + "\n";
  }
  return out;
}

uint64_t Config::hash() const {
  // Everything that changes the numbers of a run; output paths and logging do not count.
  Config c = *this;
  c.output = OutputConfig();
  c.data.dir.clear();
  c.data.sources = mixture_weights_only(c.data.sources);  // paths out, weights in: like data.dir
  c.data.stage_dir.clear();
  c.data.prefetch = 0;
  c.data.reader_threads = 0;
  c.train.steps = 0;
  c.train.threads = 0;
  c.train.inject_delay.clear();
  c.train.init_from.clear();  // a path, like data.dir; a resumed run continues from its checkpoint
  // How the CUDA backend computes, not what: a run may resume with the other attention engine
  // (cuDNN missing on another cluster) or with graphs toggled, like with other BLAS threads.
  c.train.attention.clear();
  c.train.cuda_graphs = false;
  // Likewise bf16 storage: the datapath auto picks depends on the device's self-check, and a run
  // moved to a machine where it fails must still resume.
  c.train.bf16_storage = "auto";
  // Sharding changes where the optimizer state lives and the summation order, not the run: a
  // checkpoint resumes sharded or not.
  c.train.shard_optimizer = false;
  c.train.shard = "optimizer";
  c.train.shard_group = "world";
  c.train.reshard_after_forward = true;
  // The gradient buffer's precision changes rounding, not the run (like bf16_storage): a run resumes under either.
  c.train.grad_dtype = "auto";
  // The cut-cost check changes who computes which tokens of a step, never which tokens it holds.
  c.data.cut_cost_check = 0;
  c.data.cut_cost_replan = false;
  // The in-run calibration too (and a run resumed with it toggled continues); its line stays out of
  // the hash, so a checkpoint written before the key existed resumes.
  c.data.cost_calibration.clear();
  c.comm.timeout_s = 0;
  std::string text = without_default_model_keys(c.to_ini());
  const size_t calibration = text.find("\ncost_calibration = \n");
  if (calibration != std::string::npos) text.erase(calibration, std::string("\ncost_calibration = ").size());
  // Output keys never count (c.output is reset above), but their lines are in the text: a key
  // added to [output] later (output.tensorboard) stays out, so earlier checkpoints resume.
  const size_t tensorboard = text.find("\ntensorboard = ");
  if (tensorboard != std::string::npos) text.erase(tensorboard, text.find('\n', tensorboard + 1) - tensorboard);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

// The text of a Boost.Program_options error. Boost builds it by replacing placeholders such as
// %value% and %canonical_option% in a template, over and over until none is left, so an option
// name or value that itself holds a placeholder ("--x=%value%") made what() loop forever (found by
// fuzzing). The user's text is therefore given to Boost with '%' spelled "%25".
namespace {
struct BoostErrorAccess : po::error_with_option_name {
  static std::map<std::string, std::string> po::error_with_option_name::*substitutions() {
    return &BoostErrorAccess::m_substitutions;
  }
};
}  // namespace

std::string program_options_message(po::error& e) {
  if (auto* named = dynamic_cast<po::error_with_option_name*>(&e)) {
    for (auto& entry : named->*BoostErrorAccess::substitutions()) {
      std::string safe;
      for (char c : entry.second) safe += c == '%' ? std::string("%25") : std::string(1, c);
      entry.second = safe;
    }
  }
  return e.what();
}

namespace {

// Names other trainers (nanoGPT, Megatron-LM, Hugging Face) give to what kilter calls by another
// name: the last part of an unknown key is looked up here before edit distance.
const std::map<std::string, std::string>& key_aliases() {
  static const std::map<std::string, std::string> aliases = [] {
    std::map<std::string, std::string> names = {
        {"learning_rate", "train.lr"},        {"max_iters", "train.steps"},
        {"max_steps", "train.steps"},         {"train_iters", "train.steps"},
        {"iters", "train.steps"},             {"warmup_iters", "train.warmup"},
        {"warmup_steps", "train.warmup"},     {"lr_warmup_iters", "train.warmup"},
        {"min_lr", "train.min_lr_ratio"},     {"batch_size", "train.tokens_per_step"},
        {"global_batch_size", "train.tokens_per_step"}, {"micro_batch_size", "data.max_tokens"},
        {"eval_interval", "train.eval_every"}, {"eval_iters", "train.eval_batches"},
        {"log_interval", "output.log_every"}, {"save_interval", "output.checkpoint_every"},
        {"out_dir", "output.dir"},            {"data_dir", "data.dir"},
        {"data_path", "data.dir"},            {"clip_grad", "train.grad_clip"},
        {"dtype", "train.precision"},         {"num_workers", "data.reader_threads"},
    };
    // The model's keys: the aliases column of io/model_settings.h (HF's config.json names among them).
    const model::ModelSpec defaults;
    io::for_each_model_setting(defaults, [&](const io::ModelSettingInfo& key, const auto&) {
      std::istringstream list(key.aliases);
      for (std::string alias; list >> alias;) names.emplace(alias, "model." + std::string(key.name));
    });
    return names;
  }();
  return aliases;
}

std::vector<std::string> long_names(const po::options_description& desc) {
  std::vector<std::string> names;
  for (const auto& opt : desc.options()) names.push_back(opt->long_name());
  return names;
}

std::string strip_dashes(std::string name) {
  while (!name.empty() && name.front() == '-') name.erase(0, 1);
  const size_t eq = name.find('=');
  return eq == std::string::npos ? name : name.substr(0, eq);
}

// The nearest known name (an alias of another trainer first), or "".
std::string suggest_name(const std::string& unknown, const std::vector<std::string>& names) {
  const size_t dot = unknown.rfind('.');
  const std::string last = dot == std::string::npos ? unknown : unknown.substr(dot + 1);
  auto alias = key_aliases().find(last);
  if (alias != key_aliases().end() &&
      std::find(names.begin(), names.end(), alias->second) != names.end())
    return alias->second;
  return did_you_mean(unknown, names);
}

bool names_world_size(const std::string& name) {
  for (const char* w : {"world-size", "world_size", "world", "np", "nproc", "nprocs", "nproc_per_node",
                        "nproc-per-node", "nnodes", "ranks", "num-ranks", "n"})
    if (name == w) return true;
  return false;
}

}  // namespace

std::string unknown_option_message(const std::string& option, const po::options_description& desc,
                                   const std::string& help_command) {
  const std::string name = strip_dashes(option);
  const std::vector<std::string> names = long_names(desc);
  std::ostringstream os;
  os << "unknown option --" << name;
  if (names_world_size(name) && std::find(names.begin(), names.end(), "world-size") == names.end()) {
    os << ": the launcher sets the world size, not an option (mpirun -np 4 " << help_command
       << " ..., or srun -n 4 ...)";
    return os.str();
  }
  const std::string best = suggest_name(name, names);
  if (!best.empty()) os << "; did you mean --" << best << "?";
  os << " (" << help_command << " --help lists every option)";
  return os.str();
}

int exact_option_style() {
  return po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
}

po::parsed_options parse_exact(int argc, char** argv, const po::options_description& desc,
                               const std::string& help_command,
                               const po::positional_options_description* positional) {
  po::command_line_parser parser(argc, argv);
  parser.options(desc).style(exact_option_style());
  if (positional) parser.positional(*positional);
  try {
    return parser.run();
  } catch (po::unknown_option& e) {
    throw po::error(unknown_option_message(e.get_option_name(), desc, help_command));
  }
}

// train.shard_optimizer is an alias of train.shard: an explicit shard_optimizer sets shard where
// shard is left at its default, is refused where it contradicts an explicit shard, and afterwards
// both say the same (shard_optimizer = shard != none), so the resolved config.ini reads back alike.
static void resolve_shard_alias(const po::variables_map& vm, Config& cfg) {
  const bool alias_given = vm.count("train.shard_optimizer") && !vm["train.shard_optimizer"].defaulted();
  const bool shard_given = vm.count("train.shard") && !vm["train.shard"].defaulted();
  TrainConfig& t = cfg.train;
  if (alias_given && !shard_given) t.shard = t.shard_optimizer ? "optimizer" : "none";
  if (alias_given && shard_given) {
    const bool sharded = t.shard != "none";
    KILTER_USER_CHECK(sharded == t.shard_optimizer,
                      "config keys train.shard = " << t.shard << " and train.shard_optimizer = "
                                                   << (t.shard_optimizer ? "true" : "false")
                                                   << " contradict each other: give train.shard alone "
                                                      "(shard_optimizer is its old alias)");
  }
  t.shard_optimizer = t.shard != "none";
}

int shard_group_size(const TrainConfig& train, int world_size, int ranks_per_node) {
  int G = world_size;
  if (train.shard_group == "node") G = ranks_per_node > 0 ? ranks_per_node : world_size;
  else if (train.shard_group != "world") G = std::stoi(train.shard_group);
  KILTER_USER_CHECK(G >= 1 && G <= world_size && world_size % G == 0,
                    "config key train.shard_group = " << train.shard_group << ": a shard group of " << G
                    << " ranks does not divide the world size " << world_size
                    << "; give a divisor of " << world_size << ", node or world");
  return G;
}

std::string resolved_grad_dtype(const TrainConfig& train, bool bf16_storage_in_force) {
  if (train.grad_dtype != "auto") return train.grad_dtype;
  return bf16_storage_in_force ? "bf16" : "fp32";
}

static Config parse_impl(const std::string& ini_path, const std::string* ini_text) {
  Config cfg;
  po::options_description desc;
  add_config_options(desc, cfg);
  po::variables_map vm;
  const std::string where = ini_text ? std::string("(text)") : ini_path;
  try {
    if (ini_text) {
      std::istringstream is(*ini_text);
      po::store(po::parse_config_file(is, desc, false), vm);
    } else {
      std::ifstream is(ini_path);
      KILTER_USER_CHECK(is, "cannot open config file " << ini_path);
      po::store(po::parse_config_file(is, desc, false), vm);
    }
    po::notify(vm);
    resolve_shard_alias(vm, cfg);
  } catch (po::unknown_option& e) {
    KILTER_USER_FAIL("config file " << where << ": " << unknown_key_message(e.get_option_name(), desc));
  } catch (po::error& e) {
    KILTER_USER_FAIL("config file " << where << ": " << program_options_message(e));
  }
  return cfg;
}

std::string unknown_key_message(const std::string& key, const po::options_description& desc) {
  const std::string best = suggest_name(strip_dashes(key), long_names(desc));
  std::ostringstream os;
  os << "unknown key " << strip_dashes(key);
  if (!best.empty()) {
    const size_t dot = best.find('.');
    os << "; did you mean " << best << " ([" << best.substr(0, dot) << "] " << best.substr(dot + 1) << ")?";
  }
  return os.str();
}

Config parse_config_file(const std::string& path) { return parse_impl(path, nullptr); }
Config config_from_ini_text(const std::string& text) { return parse_impl("", &text); }

bool parse_command_line(int argc, char** argv, const std::string& usage,
                        po::options_description& extra, po::variables_map& vm, Config& cfg) {
  std::string config_file;
  const std::string command = std::string("kilter ") + (argc > 0 ? argv[0] : "");
  po::options_description general("General");
  general.add_options()("help,h", "show this help")(
      "config", po::value(&config_file), "INI config file; --section.key=value overrides it");
  po::options_description keys("Config keys (INI [section] key, or --section.key=value)");
  add_config_options(keys, cfg);
  po::options_description all;
  all.add(general).add(extra).add(keys);
  try {
    po::store(parse_exact(argc, argv, all, command), vm);
    if (vm.count("help")) {
      std::cout << usage << "\n" << all << "\n";
      return false;
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream is(path);
      KILTER_USER_CHECK(is, "cannot open config file " << path << " (--config): check the path");
      try {
        po::store(po::parse_config_file(is, keys, false), vm);
      } catch (po::unknown_option& e) {
        KILTER_USER_FAIL("config file " << path << ": " << unknown_key_message(e.get_option_name(), keys));
      } catch (po::error& e) {
        KILTER_USER_FAIL("config file " << path << ": " << program_options_message(e));
      }
    }
    po::notify(vm);
  } catch (po::error& e) {
    KILTER_USER_FAIL(program_options_message(e));
  }
  resolve_shard_alias(vm, cfg);
  cfg.validate();
  return true;
}

}  // namespace kilter

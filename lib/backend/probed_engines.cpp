// probed_engines.h: the CUDA engines' probe requests, the child's body and the verdicts' effect.
#include "lib/backend/probed_engines.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "io/error.h"
#ifdef KILTER_WITH_CUDA
#include "lib/backend/cuda_model.h"
#include "lib/backend/cuda_versions.h"
#endif

namespace kilter::backend {

namespace {

std::string number(double x) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", x);
  return text;
}

// The problem as key=value arguments: the architecture's keys the self-checks read, and the options.
std::vector<std::string> problem_args(const model::ModelSpec& s, const model::BackendOptions& o) {
  return {"arch=" + s.arch,
          "n_head=" + std::to_string(s.n_head),
          "n_kv_head=" + std::to_string(s.n_kv_head),
          "n_embd=" + std::to_string(s.n_embd),
          "block_size=" + std::to_string(s.block_size),
          "norm_eps=" + number(s.norm_eps),
          "tie_embeddings=" + s.tie_embeddings,
          "qkv_bias=" + std::to_string(s.qkv_bias ? 1 : 0),
          "rope_theta=" + number(s.rope_theta),
          "rope_scaling=" + s.rope_scaling,
          "rope_factor=" + number(s.rope_factor),
          "rope_low_freq_factor=" + number(s.rope_low_freq_factor),
          "rope_high_freq_factor=" + number(s.rope_high_freq_factor),
          "rope_original_context=" + std::to_string(s.rope_original_context),
          "precision=" + o.precision,
          "recompute=" + o.recompute,
          "bf16_storage=" + o.bf16_storage};
}

void problem_from_args(const std::vector<std::string>& args, model::ModelSpec* s, model::BackendOptions* o) {
  std::map<std::string, std::string> kv;
  for (const std::string& arg : args) {
    const size_t eq = arg.find('=');
    KILTER_CHECK(eq != std::string::npos, "engine probe: argument '" << arg << "' is not key=value");
    kv[arg.substr(0, eq)] = arg.substr(eq + 1);
  }
  auto get = [&](const char* key) {
    const auto found = kv.find(key);
    KILTER_CHECK(found != kv.end(), "engine probe: argument " << key << " missing");
    return found->second;
  };
  s->arch = get("arch");
  s->n_head = std::stoi(get("n_head"));
  s->n_kv_head = std::stoi(get("n_kv_head"));
  s->n_embd = std::stoi(get("n_embd"));
  s->block_size = std::stoi(get("block_size"));
  s->norm_eps = std::stod(get("norm_eps"));
  s->tie_embeddings = get("tie_embeddings");
  s->qkv_bias = get("qkv_bias") == "1";
  s->rope_theta = std::stod(get("rope_theta"));
  s->rope_scaling = get("rope_scaling");
  s->rope_factor = std::stod(get("rope_factor"));
  s->rope_low_freq_factor = std::stod(get("rope_low_freq_factor"));
  s->rope_high_freq_factor = std::stod(get("rope_high_freq_factor"));
  s->rope_original_context = std::stoi(get("rope_original_context"));
  o->precision = get("precision");
  o->recompute = get("recompute");
  o->bf16_storage = get("bf16_storage");
}

std::string arch_family(const model::ModelSpec& s) {
  std::string family = s.arch + " group " + std::to_string(s.n_head / s.kv_heads()) + (s.tied() ? " tied" : " untied");
  if (s.llama()) family += (s.qkv_bias ? " qkv-bias" : "") + std::string(" rope-") + s.rope_scaling;
  return family;
}

bool sdpa_wanted(const model::BackendOptions& o) {
  return o.attention == "sdpa" || (o.attention == "auto" && o.precision == "bf16");
}

}  // namespace

std::optional<ProbeIdentity> engine_probe_identity(const std::string& backend) {
#ifdef KILTER_WITH_CUDA
  if (backend != "cuda" || !cuda_device_present()) return std::nullopt;
  return ProbeIdentity{cuda_device_model(), cuda_driver_version(), cudnn_version()};
#else
  (void)backend;
  return std::nullopt;
#endif
}

std::vector<ProbeRequest> engine_probe_requests(const std::string& backend, const model::ModelSpec& spec,
                                                const model::BackendOptions& options,
                                                const std::vector<std::string>& done) {
  std::vector<ProbeRequest> requests;
  if (backend != "cuda") return requests;
  auto wanted = [&](const char* engine) { return std::find(done.begin(), done.end(), engine) == done.end(); };
  const bool bf16 = options.precision == "bf16";
  if (bf16 && options.bf16_storage == "auto" && options.attention != "cudnn") {
    if (wanted("bf16_datapath"))
      requests.push_back({"bf16_datapath", arch_family(spec) + " recompute " + options.recompute,
                          problem_args(spec, options), ""});
    return requests;  // SDPA's datapath is not decided yet
  }
#ifdef KILTER_WITH_SDPA
  if (sdpa_wanted(options) && wanted("sdpa") && options.sdpa_refused.empty()) {
    const bool storage = bf16 && options.bf16_storage == "on";
    requests.push_back({"sdpa",
                        arch_family(spec) + " heads " + std::to_string(spec.n_head) + "/" +
                            std::to_string(spec.kv_heads()) + " dim " + std::to_string(spec.head_dim()) +
                            (storage ? " bf16-rows" : " fp32-rows") + " recompute " + options.recompute,
                        problem_args(spec, options), ""});
  }
  if (sdpa_wanted(options) && wanted("sdpa_cut") && options.sdpa_refused.empty())
    requests.push_back({"sdpa_cut",
                        "heads " + std::to_string(spec.n_head) + "/" + std::to_string(spec.kv_heads()) + " dim " +
                            std::to_string(spec.head_dim()) + " bottom-right",
                        problem_args(spec, options), ""});
#else
  (void)spec;
#endif
  return requests;
}

std::string run_engine_probe(const ProbeRequest& request) {
  model::ModelSpec spec;
  model::BackendOptions options;
  problem_from_args(request.args, &spec, &options);
  spec.vocab_size = 300;  // the self-checks' own; the run's plays no part
  model::check_spec(spec);
#ifdef KILTER_WITH_CUDA
  if (request.engine == "bf16_datapath") return cuda_bf16_storage_self_check(spec, options);
  if (request.engine == "sdpa") return cuda_sdpa_self_check(spec, options);
  if (request.engine == "sdpa_cut") return cuda_sdpa_cut_self_check(spec);
#endif
  KILTER_FAIL("engine probe: no engine '" << request.engine << "' in this kilter");
}

std::string apply_engine_verdict(model::BackendOptions& options, const ProbeVerdict& verdict, bool passed_everywhere) {
  const std::string why = verdict.passed && !passed_everywhere ? "it failed on another node" : verdict.error;
  if (verdict.engine == "bf16_datapath") {
    options.bf16_storage = passed_everywhere ? "on" : "off";
    options.bf16_storage_checked = true;
    return passed_everywhere ? "bf16 storage on: its datapath passed its probe on every node"
                             : "bf16 storage off (fp32 activations, bf16 GEMMs, as train.bf16_storage=off): its "
                               "datapath failed its probe (" + why + ")";
  }
  if (verdict.engine == "sdpa") {
    if (passed_everywhere) return "cuDNN SDPA attention: passed its probe on every node";
    KILTER_USER_CHECK(options.attention != "sdpa", "train.attention=sdpa: cuDNN SDPA attention failed its probe in a "
                                                   "child process on this device ("
                                                       << why << "); use train.attention=auto or cublaslt");
    options.sdpa_refused = why;
    return "cuDNN SDPA attention not used: it failed its probe (" + why + "); attention runs on cuBLASLt";
  }
  if (verdict.engine == "sdpa_cut") {
    if (passed_everywhere) return "cuDNN SDPA attention on later parts of cut pieces: passed its probe on every node";
    KILTER_USER_CHECK(options.attention != "sdpa", "train.attention=sdpa: cuDNN SDPA attention on later parts of cut "
                                                   "pieces failed its probe in a child process on this device ("
                                                       << why << "); use train.attention=auto or cublaslt");
    options.sdpa_cut_refused = why;
    return "cuDNN SDPA attention not used for later parts of cut pieces: it failed its probe (" + why +
           "); they run on cuBLASLt";
  }
  KILTER_FAIL("engine probe: no engine '" << verdict.engine << "' to apply");
}

}  // namespace kilter::backend

// Which engines a run would trust untested, as engine probes (engine_probe.h), and what their
// verdicts change: the backend's side of the probes, kept beside select.cpp, the one place that
// knows which backends exist. CUDA, train.precision = bf16:
//   bf16_datapath (train.bf16_storage = auto): the bf16-storage datapath with its cuBLASLt
//     epilogues and the bf16 cuBLASLt attention, against the CPU oracle; passed: bf16 storage on,
//     failed: off (fp32 activations, bf16 GEMMs).
//   sdpa (train.attention = auto with bf16, or sdpa; built with cudnn-frontend): cuDNN SDPA on the
//     run's heads and head_dim, on the datapath the first probe chose; failed: the run's attention
//     is the cuBLASLt engine (an error naming train.attention under sdpa).
//   sdpa_cut (likewise): the SDPA engine alone on later parts of cut pieces (bottom-right over
//     staged prefix K/V) against the CPU packed attention; failed: later parts run on cuBLASLt.
// A probe's family names the problems its verdict covers (the arch, heads, grouping, head_dim,
// datapath, recompute mode): a run of another family probes again.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "lib/backend/engine_probe.h"
#include "lib/model/model.h"

namespace kilter::backend {

// This process's device, driver and cuDNN where `backend` runs on a device; nothing otherwise
// (the CPU backend, no device, a build without CUDA): then nothing is probed.
std::optional<ProbeIdentity> engine_probe_identity(const std::string& backend);

// The probes whose problem `options` already decides, leaving out the engines in `done`: the
// bf16 datapath while train.bf16_storage is auto, SDPA once it is on or off.
std::vector<ProbeRequest> engine_probe_requests(const std::string& backend, const model::ModelSpec& spec,
                                                const model::BackendOptions& options,
                                                const std::vector<std::string>& done);

// The child's body (kilter's hidden subcommand): the engine's self-check on this device for the
// request's problem. "" passed, else why not.
std::string run_engine_probe(const ProbeRequest& request);

// The verdict every rank agreed on (passed only where it passed on every node), applied to the
// options the model is made with. Returns the line the log and summary.json give for the choice.
// Throws kilter::Error naming train.attention when an engine the configuration demands failed.
std::string apply_engine_verdict(model::BackendOptions& options, const ProbeVerdict& verdict, bool passed_everywhere);

}  // namespace kilter::backend

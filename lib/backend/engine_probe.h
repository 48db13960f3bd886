// Engine probes: code that has never run on a device proves itself in a child process before a run
// trusts it. A crash there (an illegal address inside a cuDNN kernel poisons the CUDA context for
// good; an abort in a library) ends the child, not the run: the run reads the child's verdict and
// uses the tested engine, or the fallback with the reason in its log and summary.json.
//
// The child is this very executable started again (posix_spawn) with a hidden subcommand
// (kProbeSubcommand), the engine, its family and the problem's keys as arguments. It writes a
// verdict file (JSON: engine, family, device, driver, cuDNN version, passed, error). Verdicts are
// kept per node in the run directory (<run_dir>/engine-probes/<host>/): one probe serves every rank
// of the node (the node's first rank probes, the others wait on the file, bounded) and later runs
// on the same device, driver and cuDNN. A child that dies of a signal, exits non-zero, outlives its
// time or writes no verdict is a failed probe: the engine is not used.
// MPI-free and CUDA-free: the trainer (lib/train) brings the collective agreement, the backend the
// probe bodies (select.cpp); a test brings fake bodies.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kilter::backend {

// What the hidden subcommand is called: `kilter __probe-engine --out FILE --engine E ...`.
inline constexpr const char* kProbeSubcommand = "__probe-engine";
// Tests only: a child whose engine is named here (or "all") calls abort() before probing.
inline constexpr const char* kProbeCrashVariable = "KILTER_PROBE_TEST_CRASH";

// What a verdict holds for: another device model, driver or cuDNN needs a probe of its own.
struct ProbeIdentity {
  std::string device;  // "NVIDIA H100 80GB HBM3 sm_90"
  std::string driver;  // "580.65.06 (CUDA 13.0)"
  std::string cudnn;   // "9.19.0", "none"
  bool operator==(const ProbeIdentity& o) const { return device == o.device && driver == o.driver && cudnn == o.cudnn; }
};

struct ProbeRequest {
  std::string engine;  // "bf16_datapath", "sdpa", ...
  std::string family;  // the problems the verdict covers: "gpt2 heads 12/12 dim 64"
  std::vector<std::string> args;  // key=value: what the child needs to rebuild the problem
  std::string needs;   // an engine whose verdict must have passed first ("" none)
};

struct ProbeVerdict {
  std::string engine, family;
  ProbeIdentity identity;
  bool passed = false;
  std::string error;     // why not, "" when passed
  double seconds = 0.0;  // the probe's own time
  std::string origin;    // how this run got it: probed, cached, from the node's first rank, ... (not in the file)
  std::string file;      // the verdict file (not in the file)
};

// The verdict file's name for a request: engine and family, reduced to [a-z0-9_.-].
std::string probe_file_name(const ProbeRequest& request);
std::string verdict_to_json(const ProbeVerdict& verdict);
// A verdict from its file; nothing when the file is missing or not a verdict.
std::optional<ProbeVerdict> read_verdict(const std::string& path);
// Written beside `path` and renamed onto it: a reader never sees half a verdict.
void write_verdict(const std::string& path, const ProbeVerdict& verdict);

struct ProbeLauncher {
  std::string executable;    // the binary to start; "" = this process's own (/proc/self/exe)
  double timeout_s = 300.0;  // a child still running then is killed (a hung kernel)
};

// Runs one probe in a child and waits for it (bounded). Never throws for what the child does: a
// crash, a non-zero exit, a timeout or a missing verdict come back as a failed verdict saying so.
ProbeVerdict run_probe_child(const ProbeLauncher& launcher, const ProbeRequest& request, const ProbeIdentity& identity,
                             const std::string& verdict_path);

// The node's verdict for `request` in `dir`: a verdict file already there for this identity
// ("cached"); else, where `prober`, a fresh child's, written there for the others; else (the
// node's other ranks) the prober's, waited for at most wait_s seconds (a failed verdict after).
ProbeVerdict node_verdict(const ProbeLauncher& launcher, const ProbeRequest& request, const ProbeIdentity& identity,
                          const std::string& dir, bool prober, double wait_s);

// One line for the log: the engine, family, where, the outcome and how it was obtained.
std::string describe_verdict(const ProbeVerdict& verdict);

// The child's side (the hidden subcommand): argv as run_probe_child passes it after the
// subcommand. `body(request)` runs the probe: "" passed, else why not (an exception is a failed
// verdict too). Writes the verdict file; returns the exit status (0 once a verdict was written).
using ProbeBody = std::function<std::string(const ProbeRequest&)>;
int probe_child_main(int argc, char** argv, const ProbeBody& body);

}  // namespace kilter::backend

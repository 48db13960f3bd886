// engine_probe.h: the child process, its verdict file and the node's cache of verdicts.
#include "lib/backend/engine_probe.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "io/error.h"

extern char** environ;

namespace kilter::backend {

namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ProbeVerdict failed(const ProbeRequest& request, const ProbeIdentity& identity, const std::string& error) {
  ProbeVerdict v;
  v.engine = request.engine;
  v.family = request.family;
  v.identity = identity;
  v.error = error;
  return v;
}

std::string self_executable() {
  std::error_code ec;
  const fs::path path = fs::read_symlink("/proc/self/exe", ec);
  KILTER_CHECK(!ec, "engine probe: cannot find this executable (/proc/self/exe: " << ec.message() << ")");
  return path.string();
}

// "signal 6 (Aborted)", "exit status 3".
std::string how_it_ended(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "the probe child died of signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  if (WIFEXITED(status)) return "the probe child exited with status " + std::to_string(WEXITSTATUS(status));
  return "the probe child ended abnormally";
}

std::vector<std::string> child_arguments(const std::string& executable, const ProbeRequest& request,
                                         const ProbeIdentity& identity, const std::string& out) {
  std::vector<std::string> args = {executable,  kProbeSubcommand, "--out",    out,
                                   "--engine",  request.engine,   "--family", request.family,
                                   "--device",  identity.device,  "--driver", identity.driver,
                                   "--cudnn",   identity.cudnn};
  for (const std::string& arg : request.args) args.insert(args.end(), {"--arg", arg});
  return args;
}

bool same_request(const ProbeVerdict& v, const ProbeRequest& request) {
  return v.engine == request.engine && v.family == request.family;
}

}  // namespace

std::string probe_file_name(const ProbeRequest& request) {
  std::string name = request.engine + "." + request.family;
  for (char& c : name) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    else if (!keep) c = '_';
  }
  return name + ".json";
}

std::string verdict_to_json(const ProbeVerdict& v) {
  const nlohmann::json j = {{"engine", v.engine},   {"family", v.family},     {"device", v.identity.device},
                            {"driver", v.identity.driver}, {"cudnn", v.identity.cudnn}, {"passed", v.passed},
                            {"error", v.error},     {"seconds", v.seconds}};
  return j.dump(2) + "\n";
}

std::optional<ProbeVerdict> read_verdict(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  ProbeVerdict v;
  try {
    v.engine = j.at("engine").get<std::string>();
    v.family = j.at("family").get<std::string>();
    v.identity = {j.at("device").get<std::string>(), j.at("driver").get<std::string>(), j.at("cudnn").get<std::string>()};
    v.passed = j.at("passed").get<bool>();
    v.error = j.at("error").get<std::string>();
    v.seconds = j.value("seconds", 0.0);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  v.file = path;
  return v;
}

void write_verdict(const std::string& path, const ProbeVerdict& verdict) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    KILTER_CHECK(out, "engine probe: cannot create " << tmp << " (is the run directory writable?)");
    out << verdict_to_json(verdict);
    out.close();
    KILTER_CHECK(out, "engine probe: cannot write " << tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  KILTER_CHECK(!ec, "engine probe: cannot rename " << tmp << " to " << path << ": " << ec.message());
}

ProbeVerdict run_probe_child(const ProbeLauncher& launcher, const ProbeRequest& request, const ProbeIdentity& identity,
                             const std::string& verdict_path) {
  const double start = now_seconds();
  const std::string out = verdict_path + ".child." + std::to_string(getpid());
  std::error_code ec;
  fs::remove(out, ec);
  std::string executable = launcher.executable;
  if (executable.empty()) {
    try {
      executable = self_executable();
    } catch (const Error& e) {
      return failed(request, identity, e.what());
    }
  }
  std::vector<std::string> args = child_arguments(executable, request, identity, out);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, executable.c_str(), nullptr, nullptr, argv.data(), environ);
  if (spawned != 0)
    return failed(request, identity, "cannot start the probe child " + executable + ": " + std::strerror(spawned));
  int status = 0;
  bool timed_out = false;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return failed(request, identity, std::string("waitpid: ") + std::strerror(errno));
    if (now_seconds() - start > launcher.timeout_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::optional<ProbeVerdict> written = read_verdict(out);
  fs::remove(out, ec);
  ProbeVerdict v;
  char limit[32];
  std::snprintf(limit, sizeof limit, "%g", launcher.timeout_s);
  if (timed_out) {
    v = failed(request, identity, "the probe child was still running after " + std::string(limit) + " s and was killed");
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    v = failed(request, identity, how_it_ended(status) + (written ? "; its verdict: " + written->error : ""));
  } else if (!written || !same_request(*written, request)) {
    v = failed(request, identity, "the probe child wrote no verdict to " + out);
  } else {
    v = *written;
    v.identity = identity;
  }
  if (v.seconds <= 0.0) v.seconds = now_seconds() - start;
  v.origin = "probed in a child process";
  return v;
}

ProbeVerdict node_verdict(const ProbeLauncher& launcher, const ProbeRequest& request, const ProbeIdentity& identity,
                          const std::string& dir, bool prober, double wait_s) {
  const std::string path = (fs::path(dir) / probe_file_name(request)).string();
  auto usable = [&](const std::optional<ProbeVerdict>& v) { return v && same_request(*v, request) && v->identity == identity; };
  if (prober) {
    std::optional<ProbeVerdict> cached = read_verdict(path);
    if (usable(cached)) {
      cached->origin = "cached from an earlier run";
      return *cached;
    }
    fs::create_directories(dir);
    ProbeVerdict v = run_probe_child(launcher, request, identity, path);
    write_verdict(path, v);
    v.file = path;
    return v;
  }
  const double deadline = now_seconds() + wait_s;
  for (;;) {
    std::optional<ProbeVerdict> v = read_verdict(path);
    if (usable(v)) {
      v->origin = "probed by the node's first rank";
      return *v;
    }
    if (now_seconds() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  char waited[32];
  std::snprintf(waited, sizeof waited, "%.0f", wait_s);
  ProbeVerdict v = failed(request, identity, "no verdict from the node's first rank in " + path + " within " + waited + " s");
  v.origin = "waited for";
  v.file = path;
  return v;
}

std::string describe_verdict(const ProbeVerdict& v) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f s", v.seconds);
  std::string line = "engine probe: " + v.engine + " [" + v.family + "] on " + v.identity.device + ", driver " +
                     v.identity.driver + ", cuDNN " + v.identity.cudnn + ": " +
                     (v.passed ? std::string("passed") : "FAILED (" + v.error + ")") + "; " + v.origin + " (" + seconds + ")";
  if (!v.file.empty()) line += "; verdict in " + v.file + (v.passed ? "" : " (delete it to probe again)");
  return line;
}

int probe_child_main(int argc, char** argv, const ProbeBody& body) {
  ProbeRequest request;
  ProbeIdentity identity;
  std::string out;
  for (int i = 0; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--out") out = value;
    else if (key == "--engine") request.engine = value;
    else if (key == "--family") request.family = value;
    else if (key == "--device") identity.device = value;
    else if (key == "--driver") identity.driver = value;
    else if (key == "--cudnn") identity.cudnn = value;
    else if (key == "--arg") request.args.push_back(value);
    else {
      std::fprintf(stderr, "kilter %s: unknown option %s (this subcommand is kilter's own, for engine probes)\n",
                   kProbeSubcommand, key.c_str());
      return 2;
    }
  }
  if (out.empty() || request.engine.empty()) {
    std::fprintf(stderr, "kilter %s: --out and --engine are needed (this subcommand is kilter's own)\n", kProbeSubcommand);
    return 2;
  }
  const char* crash = std::getenv(kProbeCrashVariable);
  if (crash != nullptr && (request.engine == crash || std::strcmp(crash, "all") == 0)) std::abort();
  const double start = now_seconds();
  ProbeVerdict v = failed(request, identity, "");
  try {
    v.error = body(request);
  } catch (const std::exception& e) {
    v.error = std::string("it failed to run: ") + e.what();
  }
  v.passed = v.error.empty();
  v.seconds = now_seconds() - start;
  try {
    write_verdict(out, v);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kilter %s: %s\n", kProbeSubcommand, e.what());
    return 1;
  }
  return 0;
}

}  // namespace kilter::backend

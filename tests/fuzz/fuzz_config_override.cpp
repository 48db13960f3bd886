// Fuzz harness (issue 17): raw bytes as the command line of a subcommand (lib/core/config.cpp's
// parse_command_line: `--section.key=value` overrides, with a subcommand's own flags), one
// argument per line. Inputs naming --config or --help are skipped: the first reads an arbitrary
// path (a fuzzer may name /dev/zero) and the second only prints.
#include <algorithm>
#include <boost/program_options.hpp>
#include <vector>

#include "fuzz_common.h"
#include "lib/core/config.h"

namespace po = boost::program_options;

namespace {

// Whether `arg` could select --config or --help (Boost accepts unambiguous prefixes, `-h`).
bool names_file_or_help(const std::string& arg) {
  if (arg.size() < 2 || arg[0] != '-') return false;
  // Boost also reads "---h" as a request for help, so every leading dash is stripped.
  std::string name = arg.substr(std::min(arg.find_first_not_of('-'), arg.size()));
  name = name.substr(0, name.find('='));
  if (arg[1] != '-') return name.find_first_of("h") != std::string::npos || name.empty();
  if (name.empty()) return false;
  return std::string("config").compare(0, name.size(), name) == 0 ||
         std::string("help").compare(0, name.size(), name) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args{"train"};
  std::string current;
  for (size_t i = 0; i <= size; ++i) {
    if (i == size || data[i] == '\n') {
      current.resize(std::min(current.find('\0'), current.size()));  // what argv would hold
      if (names_file_or_help(current)) return 0;
      args.push_back(current);
      current.clear();
    } else {
      current += char(data[i]);
    }
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  po::options_description extra("train");
  extra.add_options()("resume", po::value<std::string>(), "resume")("json", "json output");
  po::variables_map vm;
  kilter::Config cfg;
  try {
    if (!kilter::parse_command_line(int(args.size()), argv.data(), "usage", extra, vm, cfg))
      kilter::fuzz::finding("--help was reached although the harness filters it");
    (void)cfg.to_ini();
  } catch (const kilter::Error&) {
  }
  return 0;
}

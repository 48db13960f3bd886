// Shared text forms (see text_format.h).
#include "io/text_format.h"

#include <algorithm>

#include <cstdio>
#include <sstream>

namespace kilter::io {

std::string human_bytes(double bytes) {
  if (bytes < 1024) return std::to_string(bytes < 0 ? int64_t(0) : int64_t(bytes)) + " bytes";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = bytes / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, units[unit]);
  return text;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string rank_list_text(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

namespace {
std::string trim_blanks(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  const size_t e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
}  // namespace

std::vector<std::pair<std::string, std::string>> ini_entries(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> entries;
  std::istringstream is(text);
  std::string line, section;
  while (std::getline(is, line)) {
    line = trim_blanks(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = trim_blanks(line.substr(1, line.size() - 2));
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = trim_blanks(line.substr(0, eq));
    entries.emplace_back(section.empty() ? key : section + "." + key, trim_blanks(line.substr(eq + 1)));
  }
  return entries;
}

}  // namespace kilter::io

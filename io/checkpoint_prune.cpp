// The checkpoint folder (see checkpoint.h): file names by step, the temp name of a file being
// written, listing the complete checkpoints, pruning old ones and removing the temp files of a
// writer that died.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "io/checkpoint.h"

namespace kilter::io {
namespace {

// Parses "step-NNNNNNNN.h5" (digits only between the dash and the suffix); -1 otherwise.
int64_t step_of_file_name(const std::string& name) {
  const std::string prefix = "step-", suffix = ".h5";
  if (name.size() <= prefix.size() + suffix.size()) return -1;
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return -1;
  std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 18) return -1;
  for (char c : digits)
    if (c < '0' || c > '9') return -1;
  return std::stoll(digits);
}

std::vector<std::string> directory_entries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

}  // namespace

std::string checkpoint_file_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "step-%08lld.h5", static_cast<long long>(step));
  return buf;
}

std::string checkpoint_temp_path(const std::string& final_path) {
  auto slash = final_path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "" : final_path.substr(0, slash + 1);
  std::string name = slash == std::string::npos ? final_path : final_path.substr(slash + 1);
  return dir + "." + name + ".tmp";
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& name : directory_entries(dir)) {
    int64_t step = step_of_file_name(name);
    if (step >= 0) found.emplace_back(step, dir + "/" + name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int keep) {
  std::vector<std::string> removed;
  auto all = list_checkpoints(dir);
  if (keep < 1) keep = 1;  // never delete the newest
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
    if (::unlink(all[i].second.c_str()) == 0) removed.push_back(all[i].second);
  }
  return removed;
}

std::vector<std::string> stale_temp_files(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& name : directory_entries(dir)) {
    const std::string suffix = ".tmp";
    if (name.size() > 1 + suffix.size() && name[0] == '.' &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        step_of_file_name(name.substr(1, name.size() - 1 - suffix.size())) >= 0)
      found.push_back(dir + "/" + name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> remove_stale_temp_files(const std::string& dir) {
  std::vector<std::string> removed;
  for (const auto& path : stale_temp_files(dir))
    if (::unlink(path.c_str()) == 0) removed.push_back(path);
  return removed;
}

}  // namespace kilter::io

// Nearest-name suggestions (see did_you_mean.h).
#include "io/did_you_mean.h"

#include <algorithm>
#include <cctype>

namespace kilter {

size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

namespace {
std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower((unsigned char)c));
  return s;
}
std::string after_dot(const std::string& s) {
  const size_t dot = s.rfind('.');
  return dot == std::string::npos ? s : s.substr(dot + 1);
}
}  // namespace

std::string did_you_mean(const std::string& word_in, const std::vector<std::string>& names) {
  const std::string word = lower(word_in);
  if (word.empty()) return "";
  // A prefix of exactly one name.
  std::string only_prefix;
  int prefixes = 0;
  for (const std::string& name : names) {
    if (lower(name).rfind(word, 0) == 0 && name.size() > word.size()) {
      ++prefixes;
      only_prefix = name;
    }
  }
  if (prefixes == 1 && word.size() >= 3) return only_prefix;
  // The nearest by edit distance, over the whole name and over the part after the section.
  const size_t limit = word.size() < 3 ? 1 : std::min<size_t>(3, std::max<size_t>(2, word.size() / 3));
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::string& name : names) {
    size_t distance = edit_distance(word, lower(name));
    // --train.max_tokens for data.max_tokens: the key is right, the section is not.
    if (word.find('.') != std::string::npos && after_dot(word) == lower(after_dot(name)))
      distance = std::min<size_t>(distance, 1);
    if (distance < best_distance) {
      best_distance = distance;
      best = name;
    }
  }
  return best;
}

std::string did_you_mean_hint(const std::string& word, const std::vector<std::string>& names,
                              const std::string& prefix) {
  const std::string best = did_you_mean(word, names);
  return best.empty() ? "" : "; did you mean " + prefix + best + "?";
}

}  // namespace kilter

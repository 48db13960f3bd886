// "Did you mean": the nearest of a list of names to a word the user typed (an option, a config
// key, a subcommand, a format), as git and cargo suggest. Edit distance (optimal string alignment:
// insertions, deletions, substitutions and swaps of two neighbours), plus two cases edit distance
// misses: the word is a prefix of exactly one name (--world for --world-size), or the last part of
// a dotted name under another section (--train.max_tokens for data.max_tokens).
#pragma once
#include <string>
#include <vector>

namespace kilter {

// Optimal string alignment distance between a and b.
size_t edit_distance(const std::string& a, const std::string& b);

// The name of `names` nearest to `word`, or "" when none is near enough (a third of the word's length
// in edits, at least 2 (1 for words under 3 letters), at most 3).
std::string did_you_mean(const std::string& word, const std::vector<std::string>& names);

// "; did you mean X?" for the nearest name, or "" when none is near.
std::string did_you_mean_hint(const std::string& word, const std::vector<std::string>& names,
                              const std::string& prefix = "");

}  // namespace kilter

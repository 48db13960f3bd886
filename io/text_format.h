// Small text forms that messages across kilter share, so one quantity reads the same in every
// message: sizes in bytes, tensor shapes, lists of ranks; and the entries of an INI text.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kilter::io {

// A size in binary units, as the memory plan and the docs write them: "17 bytes", "1.2 KiB",
// "412.6 MiB", "3.0 GiB".
std::string human_bytes(double bytes);

// A tensor shape as torch prints it without the word: "[768, 3072]", "[]" for a scalar.
std::string shape_text(const std::vector<int64_t>& shape);

// Ranks in ascending order with runs collapsed: "0-3", "0,2,5-6" (any order given).
std::string rank_list_text(std::vector<int> ranks);

// "section.key" -> value pairs of an INI text in file order ("[section]" headers, "key = value"
// lines; blank lines and #/; comments skipped). For reading run directories' config.ini as text.
std::vector<std::pair<std::string, std::string>> ini_entries(const std::string& text);

}  // namespace kilter::io

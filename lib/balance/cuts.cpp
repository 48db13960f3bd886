// The cut pieces of a step (plan.h, step_cuts): which ranks hold which parts of a piece that the
// plan divided between ranks, checked against the rules every exchange relies on.
#include <algorithm>
#include <map>
#include <utility>

#include "io/base/error.h"
#include "lib/balance/plan.h"

namespace kilter::balance {

std::vector<CutPiece> step_cuts(const Step& step) {
  // (doc, piece_start) -> parts; pieces with a single part at offset 0 are not cut.
  std::map<std::pair<uint64_t, uint32_t>, std::vector<CutPart>> by_piece;
  for (size_t rank = 0; rank < step.rank_batches.size(); ++rank) {
    const std::vector<uint32_t>& ids = step.rank_batches[rank];
    for (size_t local = 0; local < ids.size(); ++local) {
      for (const Piece& p : step.micro_batches[ids[local]].pieces) {
        KILTER_CHECK(p.offset <= p.start, "plan: a part of document " << p.doc << " has offset " << p.offset
                                                                      << " beyond its start " << p.start);
        by_piece[{p.doc, p.piece_start()}].push_back(CutPart{int(rank), uint32_t(local), p.offset, p.len});
      }
    }
  }
  std::vector<CutPiece> cuts;
  for (auto& [key, parts] : by_piece) {
    if (parts.size() == 1 && parts[0].offset == 0) continue;
    std::sort(parts.begin(), parts.end(), [](const CutPart& x, const CutPart& y) { return x.offset < y.offset; });
    const auto where = [&]() {
      return "plan: cut piece at token " + std::to_string(key.second) + " of document " + std::to_string(key.first);
    };
    KILTER_CHECK(parts.size() >= 2, where() << " has one part, at offset " << parts[0].offset
                                            << ": its earlier tokens are in no part of the step");
    KILTER_CHECK(parts[0].offset == 0, where() << ": its first part starts at offset " << parts[0].offset);
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      KILTER_CHECK(parts[i + 1].offset == parts[i].offset + parts[i].len,
                   where() << ": parts not contiguous (" << parts[i].offset << "+" << parts[i].len << " then "
                           << parts[i + 1].offset << ")");
      KILTER_CHECK(parts[i + 1].micro_batch == parts[0].micro_batch,
                   where() << ": parts at local micro-batches " << parts[0].micro_batch << " and "
                           << parts[i + 1].micro_batch << " (every part of a piece must share one slot)");
    }
    for (size_t i = 0; i < parts.size(); ++i)
      for (size_t j = i + 1; j < parts.size(); ++j)
        KILTER_CHECK(parts[i].rank != parts[j].rank, where() << ": two parts on rank " << parts[i].rank);
    cuts.push_back(CutPiece{key.first, key.second, std::move(parts)});
  }
  return cuts;
}

std::vector<CutPiece> step_cuts(const StepView& step) { return step_cuts(step.expand()); }

}  // namespace kilter::balance

// StepCuts (cut_schedule.h): the step's cut pieces indexed by (document, piece start), and the
// per-micro-batch lists of runs both ends of every K/V message derive alike.
#include "lib/train/cut_schedule.h"

#include <algorithm>

#include "io/base/error.h"

namespace kilter::train {

StepCuts::StepCuts(std::vector<balance::CutPiece> cuts) : cuts_(std::move(cuts)) {
  for (size_t c = 0; c < cuts_.size(); ++c) index_[{cuts_[c].doc, cuts_[c].piece_start}] = c;
}

StepCuts StepCuts::of(const balance::StepView& step) { return StepCuts(balance::step_cuts(step)); }
StepCuts StepCuts::of(const balance::Step& step) { return StepCuts(balance::step_cuts(step)); }

comm::KvSchedule StepCuts::schedule(const balance::MicroBatch& mb, int rank, uint32_t slot, int64_t step) const {
  comm::KvSchedule s;
  s.step = step;
  s.slot = slot;
  if (cuts_.empty()) return s;
  // (cut index, batch piece, this rank's part index) of the micro-batch's cut pieces.
  struct Mine {
    size_t cut;
    int32_t piece;
    size_t part;
  };
  std::vector<Mine> mine;
  std::vector<int32_t> first_row(mb.pieces.size(), 0);
  int32_t row = 0;
  s.pieces.resize(mb.pieces.size());
  for (size_t p = 0; p < mb.pieces.size(); ++p) {
    const balance::Piece& piece = mb.pieces[p];
    first_row[p] = row;
    row += int32_t(mb.packed() ? piece.len : mb.padded_len);
    comm::KvPieceInfo& info = s.pieces[p];
    info.doc = piece.doc;
    info.piece_start = piece.piece_start();
    info.offset = piece.offset;
    info.len = piece.len;
    const auto it = index_.find({piece.doc, piece.piece_start()});
    if (it == index_.end()) {
      KILTER_CHECK(piece.offset == 0, "plan: " << s.describe_piece(int(p)) << " has an offset but is not cut");
      continue;
    }
    const balance::CutPiece& cut = cuts_[it->second];
    size_t part = cut.parts.size();
    for (size_t i = 0; i < cut.parts.size(); ++i)
      if (cut.parts[i].offset == piece.offset) part = i;
    KILTER_CHECK(part < cut.parts.size() && cut.parts[part].rank == rank && cut.parts[part].len == piece.len &&
                     cut.parts[part].micro_batch == slot,
                 "plan: " << s.describe_piece(int(p)) << " on rank " << rank << ", micro-batch " << slot
                          << " is not a part the step's cuts list there");
    KILTER_CHECK(mb.packed(), "plan: " << s.describe_piece(int(p)) << " is a part of a cut piece in a padded "
                                       << "(naive) micro-batch; only packed micro-batches hold parts");
    info.cut = true;
    mine.push_back(Mine{it->second, int32_t(p), part});
  }
  // Both ends list a pair's runs in the step's cut order.
  std::sort(mine.begin(), mine.end(), [](const Mine& x, const Mine& y) { return x.cut < y.cut; });
  std::map<int, comm::KvPeer> later, earlier;
  for (const Mine& m : mine) {
    const balance::CutPiece& cut = cuts_[m.cut];
    const balance::CutPart& own = cut.parts[m.part];
    for (size_t j = 0; j < cut.parts.size(); ++j) {
      const balance::CutPart& other = cut.parts[j];
      if (j > m.part) {
        comm::KvPeer& peer = later[other.rank];
        peer.rank = other.rank;
        peer.runs.push_back(comm::KvRun{m.piece, first_row[size_t(m.piece)], int32_t(own.len)});
      } else if (j < m.part) {
        comm::KvPeer& peer = earlier[other.rank];
        peer.rank = other.rank;
        peer.runs.push_back(comm::KvRun{m.piece, int32_t(other.offset), int32_t(other.len)});
      }
    }
  }
  for (auto& [r, peer] : later) s.later.push_back(std::move(peer));
  for (auto& [r, peer] : earlier) s.earlier.push_back(std::move(peer));
  return s;
}

}  // namespace kilter::train

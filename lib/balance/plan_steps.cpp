// The compact storage of an epoch plan's steps (PlanSteps) and the view the trainer reads a step
// through (StepView); see plan.h. Offsets inside a step are 32-bit and checked: a step holds
// fewer than 2^32 pieces and micro-batches; document ids are 32-bit and checked too.
#include <algorithm>
#include <limits>

#include "io/base/error.h"
#include "lib/balance/plan.h"

namespace kilter::balance {

PlanSteps::PlanSteps(uint32_t context, int world_size, bool padded, CostModel cost)
    : context_(context), world_size_(world_size), padded_(padded), cost_(cost) {
  KILTER_CHECK(context >= 1, "plan: context " << context << " must be >= 1");
  KILTER_CHECK(world_size >= 1, "plan: world size " << world_size << " must be >= 1");
}

void PlanSteps::reserve(uint64_t steps, uint64_t pieces, uint64_t micro_batches) {
  pieces_.reserve(pieces);
  mb_piece_end_.reserve(micro_batches);
  rank_mb_end_.reserve(steps * uint64_t(world_size_));
  step_piece_end_.reserve(steps);
  step_mb_end_.reserve(steps);
  step_target_tokens_.reserve(steps);
  step_part_end_.reserve(steps);
}

void PlanSteps::add_piece(const Piece& p) {
  KILTER_CHECK(p.doc <= std::numeric_limits<uint32_t>::max(),
               "plan: document id " << p.doc << " does not fit the plan's 32-bit document ids; split the dataset "
               "into parts of fewer than 2^32 documents");
  KILTER_CHECK(p.len >= 1 && p.offset <= p.start && p.piece_start() % context_ == 0 &&
                   uint64_t(p.offset) + p.len <= context_ &&
                   uint64_t(p.start) + p.len - 1 <= std::numeric_limits<uint32_t>::max(),
               "plan: piece (document " << p.doc << ", start " << p.start << ", offset " << p.offset << ", " << p.len
               << " tokens) is not a part of a cut of the context " << context_ << " (cut_documents makes them)");
  KILTER_CHECK(building_pieces_ < std::numeric_limits<uint32_t>::max(),
               "plan: a step of more than 2^32 pieces; lower train.tokens_per_step");
  if (p.offset > 0) parts_.push_back(StoredPart{uint32_t(building_pieces_), p.offset});
  pieces_.push_back(StoredPiece{uint32_t(p.doc), p.start + p.len - 1});
  ++building_pieces_;
}

void PlanSteps::end_micro_batch() {
  const uint64_t first = building_mbs_ == 0 ? 0 : mb_piece_end_.back();
  KILTER_CHECK(building_pieces_ > first, "plan: an empty micro-batch (rank " << building_ranks_ << ")");
  KILTER_CHECK(building_mbs_ < std::numeric_limits<uint32_t>::max(),
               "plan: a step of more than 2^32 micro-batches; lower train.tokens_per_step");
  mb_piece_end_.push_back(uint32_t(building_pieces_));
  ++building_mbs_;
}

void PlanSteps::end_rank() {
  KILTER_CHECK(building_ranks_ < world_size_, "plan: more ranks than the world size " << world_size_ << " in a step");
  rank_mb_end_.push_back(uint32_t(building_mbs_));
  ++building_ranks_;
}

void PlanSteps::end_step(uint64_t target_tokens) {
  KILTER_CHECK(building_ranks_ == world_size_,
               "plan: a step closed with " << building_ranks_ << " of " << world_size_ << " ranks");
  step_piece_end_.push_back(pieces_.size());
  step_mb_end_.push_back(mb_piece_end_.size());
  step_target_tokens_.push_back(target_tokens);
  step_part_end_.push_back(parts_.size());
  building_pieces_ = building_mbs_ = 0;
  building_ranks_ = 0;
}

void PlanSteps::shrink_to_fit() {
  pieces_.shrink_to_fit();
  mb_piece_end_.shrink_to_fit();
  rank_mb_end_.shrink_to_fit();
  step_piece_end_.shrink_to_fit();
  step_mb_end_.shrink_to_fit();
  step_target_tokens_.shrink_to_fit();
  parts_.shrink_to_fit();
  step_part_end_.shrink_to_fit();
}

uint64_t PlanSteps::heap_bytes() const {
  return pieces_.capacity() * sizeof(StoredPiece) + mb_piece_end_.capacity() * sizeof(uint32_t) +
         rank_mb_end_.capacity() * sizeof(uint32_t) +
         (step_piece_end_.capacity() + step_mb_end_.capacity() + step_target_tokens_.capacity() +
          step_part_end_.capacity()) * sizeof(uint64_t) +
         parts_.capacity() * sizeof(StoredPart);
}

// ---- StepView ---------------------------------------------------------------------------------

uint64_t StepView::target_tokens() const { return steps_->step_target_tokens_.at(index_); }

uint32_t StepView::micro_batch_count() const {
  return uint32_t(steps_->step_mb_end_.at(index_) - steps_->step_mb_begin(index_));
}

int StepView::world_size() const { return steps_->world_size_; }

std::pair<uint32_t, uint32_t> StepView::rank_micro_batches(int rank) const {
  KILTER_CHECK(rank >= 0 && rank < steps_->world_size_,
               "plan: rank " << rank << " outside the plan's world size " << steps_->world_size_);
  const uint64_t row = index_ * uint64_t(steps_->world_size_);
  const uint32_t first = rank == 0 ? 0 : steps_->rank_mb_end_[row + uint64_t(rank) - 1];
  return {first, steps_->rank_mb_end_[row + uint64_t(rank)]};
}

void StepView::micro_batch(uint32_t id, MicroBatch& out) const {
  const PlanSteps& st = *steps_;
  KILTER_CHECK(id < micro_batch_count(), "plan: micro-batch " << id << " outside step " << index_ << " ("
               << micro_batch_count() << " micro-batches)");
  const uint64_t mb = st.step_mb_begin(index_) + id;
  const uint64_t base = st.step_piece_begin(index_);
  const uint64_t first = base + (id == 0 ? 0 : st.mb_piece_end_[mb - 1]);
  const uint64_t last = base + st.mb_piece_end_[mb];
  out.pieces.clear();
  out.padded_len = 0;
  out.target_tokens = 0;
  uint32_t longest = 0;
  // The step's later parts are sorted by index: the first at or after this micro-batch's.
  const auto parts_end = st.parts_.begin() + long(st.step_part_end_[index_]);
  auto part = std::lower_bound(st.parts_.begin() + long(st.step_part_begin(index_)), parts_end, uint32_t(first - base),
                               [](const PlanSteps::StoredPart& x, uint32_t i) { return x.index < i; });
  for (uint64_t i = first; i < last; ++i) {
    uint32_t offset = 0;
    if (part != parts_end && part->index == i - base) offset = (part++)->offset;
    const Piece p = st.piece(i, offset);
    out.pieces.push_back(p);
    out.target_tokens += p.len;
    longest = std::max(longest, p.len);
  }
  if (st.padded_) out.padded_len = longest;
  out.cost = st.cost_(out);
}

MicroBatch StepView::micro_batch(uint32_t id) const {
  MicroBatch mb;
  micro_batch(id, mb);
  return mb;
}

Step StepView::expand() const {
  Step step;
  step.target_tokens = target_tokens();
  const uint32_t n = micro_batch_count();
  step.micro_batches.resize(n);
  for (uint32_t m = 0; m < n; ++m) micro_batch(m, step.micro_batches[m]);
  step.rank_batches.resize(size_t(world_size()));
  for (int r = 0; r < world_size(); ++r) {
    const auto [first, end] = rank_micro_batches(r);
    for (uint32_t m = first; m < end; ++m) step.rank_batches[r].push_back(m);
  }
  return step;
}

}  // namespace kilter::balance

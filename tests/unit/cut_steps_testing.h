// Hand-made steps holding pieces cut between ranks, shared by the schedule's unit tests
// (train_cut_schedule_test.cpp) and the exchange's MPI test (tests/mpi/kv_exchange_test.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "lib/balance/plan.h"

namespace kilter::testing {

// A step from [rank][slot] -> pieces (micro-batches packed).
inline balance::Step make_step(const std::vector<std::vector<std::vector<balance::Piece>>>& ranks) {
  balance::Step step;
  step.rank_batches.resize(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r)
    for (const auto& pieces : ranks[r]) {
      balance::MicroBatch mb;
      mb.pieces = pieces;
      for (const balance::Piece& p : pieces) mb.target_tokens += p.len;
      step.rank_batches[r].push_back(uint32_t(step.micro_batches.size()));
      step.micro_batches.push_back(mb);
      step.target_tokens += mb.target_tokens;
    }
  return step;
}

// Part [offset, offset + len) of the piece of document `doc` at token `piece_start`.
inline balance::Piece part(uint64_t doc, uint32_t piece_start, uint32_t offset, uint32_t len) {
  return balance::Piece{doc, piece_start + offset, len, offset};
}

// Three ranks, two slots:
//   A (doc 1 at 0, 11 tokens): parts 0-4 on rank 0, 5-8 on rank 1 (a middle part: it sends and
//     receives), 9-10 on rank 2; slot 0.
//   B (doc 2 at 1024, 12 tokens): 0-3 on rank 1, 4-6 on rank 0, 7-11 on rank 2; slot 0: rank 0
//     is earlier for A and later for B in the same slot, rank 1 the other way round.
//   C (doc 3 at 0, 8 tokens): 0-5 on rank 0, 6-7 on rank 1; slot 1 (a second slot).
//   Uncut pieces around them (doc 9, doc 10).
inline balance::Step three_rank_step() {
  return make_step({
      {{part(1, 0, 0, 5), part(9, 0, 0, 3), part(2, 1024, 4, 3)}, {part(3, 0, 0, 6)}},
      {{part(1, 0, 5, 4), part(2, 1024, 0, 4)}, {part(10, 0, 0, 2), part(3, 0, 6, 2)}},
      {{part(2, 1024, 7, 5), part(1, 0, 9, 2)}, {part(10, 256, 0, 4)}},
  });
}

// Two ranks, two slots: A (doc 1) 0-4 on rank 0, 5-8 on rank 1; B (doc 2 at 1024) 0-3 on rank 1,
// 4-6 on rank 0 (slot 0); C (doc 3) 0-5 on rank 0, 6-7 on rank 1 (slot 1); uncut doc 9.
inline balance::Step two_rank_step() {
  return make_step({
      {{part(1, 0, 0, 5), part(9, 0, 0, 3), part(2, 1024, 4, 3)}, {part(3, 0, 0, 6)}},
      {{part(2, 1024, 0, 4), part(1, 0, 5, 4)}, {part(3, 0, 6, 2)}},
  });
}

}  // namespace kilter::testing

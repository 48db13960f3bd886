// Cost-balanced assignment of one step's micro-batches to ranks: longest-processing-time first
// to the least-loaded rank, then pairwise moves and swaps that lower the busiest rank's load.
// Pure function of (costs, world_size): every rank computes the same assignment.
#pragma once
#include <cstdint>
#include <vector>

namespace kilter::balance {

// Returns, per rank, the indices into `costs` it runs, in ascending index order. A rank gets
// no index when there are fewer items than ranks. Ties go to the lower rank, so the result is
// deterministic.
std::vector<std::vector<uint32_t>> assign_by_cost(const std::vector<double>& costs, int world_size);

// max rank load / mean rank load of an assignment (1 when every load is 0).
double assignment_imbalance(const std::vector<double>& costs,
                            const std::vector<std::vector<uint32_t>>& assignment);

}  // namespace kilter::balance

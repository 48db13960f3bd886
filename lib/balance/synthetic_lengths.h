// Synthetic document lengths for `kilter plan --lengths SPEC --docs N` and the planning
// benchmarks: lognormal:MU,SIGMA[,MAX] (round(exp(MU + SIGMA z)), capped at MAX) or
// uniform:MIN,MAX (integers, both ends included). Deterministic from the seed on every machine
// that has the same libm (exp, log, cos).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kilter::balance {

struct LengthSpec {
  std::string kind;  // lognormal | uniform
  double mu = 0, sigma = 0;
  uint64_t min = 0, max = 0;  // uniform bounds; lognormal cap (max)
};

// Parses SPEC; throws kilter::Error naming `key` (the flag) and what is wrong.
LengthSpec parse_length_spec(const std::string& spec, const std::string& key = "--lengths");

std::vector<uint32_t> synthetic_lengths(const LengthSpec& spec, uint64_t num_docs, uint64_t seed);

}  // namespace kilter::balance

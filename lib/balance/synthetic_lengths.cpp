// Synthetic document lengths (see synthetic_lengths.h).
#include "lib/balance/synthetic_lengths.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "io/base/error.h"
#include "lib/balance/rng.h"

namespace kilter::balance {

LengthSpec parse_length_spec(const std::string& spec, const std::string& key) {
  const size_t colon = spec.find(':');
  KILTER_CHECK(colon != std::string::npos, key << " = '" << spec
               << "': expected lognormal:MU,SIGMA[,MAX] or uniform:MIN,MAX");
  LengthSpec out;
  out.kind = spec.substr(0, colon);
  std::vector<double> values;
  std::istringstream is(spec.substr(colon + 1));
  for (std::string item; std::getline(is, item, ',');) {
    try {
      size_t used = 0;
      values.push_back(std::stod(item, &used));
      KILTER_CHECK(used == item.size(), key << " = '" << spec << "': '" << item << "' is not a number");
    } catch (const std::logic_error&) {
      KILTER_FAIL(key << " = '" << spec << "': '" << item << "' is not a number");
    }
  }
  constexpr double kLimit = double(std::numeric_limits<uint32_t>::max());
  if (out.kind == "lognormal") {
    KILTER_CHECK(values.size() == 2 || values.size() == 3, key << " = '" << spec << "': lognormal takes MU,SIGMA[,MAX]");
    out.mu = values[0];
    out.sigma = values[1];
    KILTER_CHECK(out.sigma >= 0, key << " = '" << spec << "': SIGMA must be >= 0");
    const double cap = values.size() == 3 ? values[2] : kLimit;
    KILTER_CHECK(cap >= 1 && cap <= kLimit, key << " = '" << spec << "': MAX must be in [1, 2^32)");
    out.max = static_cast<uint64_t>(cap);
  } else if (out.kind == "uniform") {
    KILTER_CHECK(values.size() == 2, key << " = '" << spec << "': uniform takes MIN,MAX");
    KILTER_CHECK(values[0] >= 0 && values[0] <= values[1] && values[1] <= kLimit,
                 key << " = '" << spec << "': need 0 <= MIN <= MAX < 2^32");
    out.min = static_cast<uint64_t>(values[0]);
    out.max = static_cast<uint64_t>(values[1]);
  } else {
    KILTER_FAIL(key << " = '" << spec << "': unknown distribution '" << out.kind << "' (lognormal | uniform)");
  }
  return out;
}

std::vector<uint32_t> synthetic_lengths(const LengthSpec& spec, uint64_t num_docs, uint64_t seed) {
  std::vector<uint32_t> lengths(num_docs);
  Xoshiro256 rng(seed, 0, RngStream::kSynthetic);
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (uint64_t i = 0; i < num_docs; ++i) {
    if (spec.kind == "uniform") {
      lengths[i] = static_cast<uint32_t>(spec.min + rng.below(spec.max - spec.min + 1));
    } else {
      // Box-Muller with the portable generator (std::normal_distribution is implementation-defined).
      const double u1 = rng.uniform_open0(), u2 = rng.uniform_open0();
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
      const double len = std::round(std::exp(spec.mu + spec.sigma * z));
      lengths[i] = static_cast<uint32_t>(std::min(len, double(spec.max)));
    }
  }
  return lengths;
}

}  // namespace kilter::balance

#pragma once
// The context lengths ds4-bench measures at (docs/SURFACES.md 5.1): ctx_start, then +step_incr (or
// x step_mul, rounded up, when step_mul > 1) up to ctx_max, the last one clamped to ctx_max.
#include <cstdint>
#include <vector>

namespace ds4::bench {

// Throws ds4::Error for start == 0, start > max, step_incr == 0, step_mul < 1.
std::vector<uint32_t> bench_frontiers(uint32_t ctx_start, uint32_t ctx_max, uint32_t step_incr,
                                      double step_mul);

}  // namespace ds4::bench

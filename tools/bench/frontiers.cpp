#include "frontiers.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace ds4::bench {

std::vector<uint32_t> bench_frontiers(uint32_t ctx_start, uint32_t ctx_max, uint32_t step_incr,
                                      double step_mul) {
    if (ctx_start == 0) throw Error("--ctx-start must be > 0");
    if (ctx_start > ctx_max)
        throw Error(fmt::format("--ctx-start {} is above --ctx-max {}", ctx_start, ctx_max));
    if (!(step_mul >= 1)) throw Error(fmt::format("--step-mul {} must be >= 1", step_mul));
    if (step_mul == 1 && step_incr == 0) throw Error("--step-incr must be > 0");
    std::vector<uint32_t> out;
    uint64_t cur = ctx_start;
    while (true) {
        out.push_back(uint32_t(std::min<uint64_t>(cur, ctx_max)));
        if (cur >= ctx_max) break;
        // A multiplier too small to move a short frontier still advances it by one token.
        const uint64_t next =
            step_mul > 1 ? uint64_t(std::ceil(double(cur) * step_mul)) : cur + step_incr;
        cur = std::max(next, cur + 1);
    }
    return out;
}

}  // namespace ds4::bench

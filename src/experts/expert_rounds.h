#pragma once
// A prefill chunk's routed (token, slot) pairs in rounds whose experts fit a bounded set of
// slots at once (the CUDA device tier, runtime/cuda/device_expert_tier.h): each round names at
// most `slots` experts, and its grouping is the one the grouped products read
// (backend/cuda/expert_groups.h) restricted to them: offsets[e] .. offsets[e + 1] - 1 index
// `order`, which lists expert e's pairs in increasing pair number p = token * n_used + slot,
// and the groups of the experts outside the round are empty. Every pair is in exactly one
// round; the rounds take the chunk's experts in increasing id order.
//
// Each pair's output does not depend on how the pairs are grouped (the grouped products give
// every pair the bits of its decode step), so rounds change which experts' weights are on the
// device at a time, not the results.
#include <cstdint>
#include <span>
#include <vector>

namespace ds4::experts {

struct ExpertRound {
    std::vector<uint32_t> experts;  // increasing ids, 1 .. slots of them
    std::vector<int32_t> offsets;   // n_expert + 1
    std::vector<int32_t> order;     // the round's pairs
};

// ids: the chunk's pairs' expert ids, each in [0, n_expert). Throws ds4::Error for an id out of
// range or slots == 0. No pairs: no rounds.
std::vector<ExpertRound> expert_rounds(std::span<const int32_t> ids, uint32_t n_expert,
                                       uint32_t slots);

}  // namespace ds4::experts

#include "experts/expert_rounds.h"

#include <fmt/format.h>

#include "common/error.h"

namespace ds4::experts {

std::vector<ExpertRound> expert_rounds(std::span<const int32_t> ids, uint32_t n_expert,
                                       uint32_t slots) {
    if (slots == 0) throw Error("expert rounds: no slots");
    std::vector<int32_t> count(n_expert, 0);
    for (size_t p = 0; p < ids.size(); ++p) {
        if (ids[p] < 0 || uint32_t(ids[p]) >= n_expert)
            throw Error(fmt::format("expert rounds: pair {} names expert {} (the layer has {})", p,
                                    ids[p], n_expert));
        ++count[ids[p]];
    }
    std::vector<uint32_t> used;
    for (uint32_t e = 0; e < n_expert; ++e)
        if (count[e] > 0) used.push_back(e);

    std::vector<ExpertRound> rounds;
    std::vector<int32_t> round_of(n_expert, -1);
    for (size_t i = 0; i < used.size(); ++i) {
        if (i % slots == 0) rounds.emplace_back();
        rounds.back().experts.push_back(used[i]);
        round_of[used[i]] = int32_t(rounds.size() - 1);
    }
    // A counting sort per round: offsets from the counts of the round's experts (the others'
    // groups empty), then the pairs placed in increasing p.
    for (size_t r = 0; r < rounds.size(); ++r) {
        ExpertRound &round = rounds[r];
        round.offsets.assign(size_t(n_expert) + 1, 0);
        int32_t sum = 0;
        for (uint32_t e = 0; e < n_expert; ++e) {
            round.offsets[e] = sum;
            if (round_of[e] == int32_t(r)) sum += count[e];
        }
        round.offsets[n_expert] = sum;
        round.order.assign(size_t(sum), 0);
        std::vector<int32_t> cursor(round.offsets.begin(), round.offsets.end() - 1);
        for (size_t p = 0; p < ids.size(); ++p)
            if (round_of[ids[p]] == int32_t(r)) round.order[cursor[ids[p]]++] = int32_t(p);
    }
    return rounds;
}

}  // namespace ds4::experts

// experts/expert_rounds.h: a chunk's pairs in rounds of at most `slots` experts. The grouping
// of each round is checked against a stable sort of the pairs by expert (the order the device's
// group_by_expert produces, backend/cuda/expert_groups.h), restricted to the round's experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "common/error.h"
#include "experts/expert_rounds.h"

namespace ds4::experts {
namespace {

// The pairs of `experts` (a set), grouped by expert, each group in increasing p.
std::vector<int32_t> stable_grouping(const std::vector<int32_t> &ids,
                                     const std::set<uint32_t> &experts) {
    std::vector<int32_t> p;
    for (size_t i = 0; i < ids.size(); ++i)
        if (experts.count(uint32_t(ids[i]))) p.push_back(int32_t(i));
    std::stable_sort(p.begin(), p.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
    return p;
}

void check_rounds(const std::vector<int32_t> &ids, uint32_t n_expert, uint32_t slots) {
    const std::vector<ExpertRound> rounds = expert_rounds(ids, n_expert, slots);
    std::set<uint32_t> all(ids.begin(), ids.end());
    const size_t want_rounds = (all.size() + slots - 1) / slots;
    ASSERT_EQ(rounds.size(), want_rounds);
    std::vector<int> seen(ids.size(), 0);
    uint32_t last = 0;
    bool first = true;
    for (const ExpertRound &r : rounds) {
        ASSERT_FALSE(r.experts.empty());
        ASSERT_LE(r.experts.size(), slots);
        for (uint32_t e : r.experts) {  // increasing over all rounds
            if (!first) {
                ASSERT_GT(e, last);
            }
            last = e;
            first = false;
        }
        const std::set<uint32_t> in(r.experts.begin(), r.experts.end());
        ASSERT_EQ(r.order, stable_grouping(ids, in));
        ASSERT_EQ(r.offsets.size(), size_t(n_expert) + 1);
        ASSERT_EQ(r.offsets.front(), 0);
        ASSERT_EQ(r.offsets.back(), int32_t(r.order.size()));
        for (uint32_t e = 0; e < n_expert; ++e) {
            ASSERT_LE(r.offsets[e], r.offsets[e + 1]);
            const int32_t n = int32_t(std::count(ids.begin(), ids.end(), int32_t(e)));
            ASSERT_EQ(r.offsets[e + 1] - r.offsets[e], in.count(e) ? n : 0) << "expert " << e;
            for (int32_t i = r.offsets[e]; i < r.offsets[e + 1]; ++i)
                ASSERT_EQ(ids[r.order[i]], int32_t(e));
        }
        for (int32_t p : r.order) ++seen[p];
    }
    for (size_t p = 0; p < ids.size(); ++p) ASSERT_EQ(seen[p], 1) << "pair " << p;
}

TEST(ExpertRounds, EveryPairOnceInGroupsOfAtMostSlotsExperts) {
    std::mt19937 rng(7);
    for (uint32_t n_expert : {1u, 6u, 32u, 256u})
        for (uint32_t tokens : {1u, 3u, 16u, 200u})
            for (uint32_t slots : {1u, 2u, 6u, 7u, 64u, 300u}) {
                const uint32_t k = std::min(6u, n_expert);
                std::vector<int32_t> ids;
                for (uint32_t t = 0; t < tokens; ++t) {  // k distinct experts a token
                    std::vector<int32_t> e(n_expert);
                    std::iota(e.begin(), e.end(), 0);
                    std::shuffle(e.begin(), e.end(), rng);
                    ids.insert(ids.end(), e.begin(), e.begin() + k);
                }
                SCOPED_TRACE(testing::Message() << n_expert << " experts, " << tokens << " tokens, "
                                                << slots << " slots");
                check_rounds(ids, n_expert, slots);
            }
}

TEST(ExpertRounds, AnExpertNamedTwiceByOneTokenKeepsBothPairs) {
    // A hash table may name an expert twice for one token.
    check_rounds({3, 3, 1, 0, 3, 2}, 4, 2);
}

TEST(ExpertRounds, NoPairsNoRounds) {
    EXPECT_TRUE(expert_rounds({}, 8, 3).empty());
}

TEST(ExpertRounds, RefusesAnIdOutOfRangeAndNoSlots) {
    const std::vector<int32_t> bad{0, 8}, neg{-1};
    EXPECT_THROW(expert_rounds(bad, 8, 4), Error);
    EXPECT_THROW(expert_rounds(neg, 8, 4), Error);
    const std::vector<int32_t> ok{0, 1};
    EXPECT_THROW(expert_rounds(ok, 8, 0), Error);
}

}  // namespace
}  // namespace ds4::experts

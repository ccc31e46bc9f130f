// The slot bookkeeping alone: the victim order (empty, then lowest hotness, then least recently
// used), pins that are never chosen, decay, and a random walk checked against a brute-force
// model of the same rules.
#include <gtest/gtest.h>

#include <random>

#include "common/error.h"
#include "experts/expert_cache.h"

using namespace ds4;
using namespace ds4::experts;

namespace {

TEST(ExpertCache, EmptySlotsGoFirst) {
    ExpertCache c(2, 4, 3);
    c.assign(0, 0, 1);
    EXPECT_EQ(c.victim(), 1);
    EXPECT_EQ(c.slot_of(0, 1), 0);
    EXPECT_EQ(c.slot_of(0, 2), ExpertCache::kNone);
    EXPECT_EQ(c.layer_of(0), 0u);
    EXPECT_EQ(c.expert_of(0), 1u);
}

TEST(ExpertCache, LowestHotnessThenLeastRecentlyUsed) {
    ExpertCache c(1, 8, 3);
    c.assign(0, 0, 0);
    c.assign(1, 0, 1);
    c.assign(2, 0, 2);
    for (int i = 0; i < 3; ++i) c.select(0, 0);  // expert 0 is hot
    c.select(0, 1);
    c.select(0, 2);
    c.touch(0, 1);
    c.touch(1, 3);
    c.touch(2, 2);
    EXPECT_EQ(c.victim(), 2);  // hotness 1 like slot 1, used earlier
    c.touch(2, 4);
    EXPECT_EQ(c.victim(), 1);
    c.select(0, 1);  // slot 1 now hotter than slot 2
    EXPECT_EQ(c.victim(), 2);
    EXPECT_EQ(c.hotness(0, 0), 3u);
}

TEST(ExpertCache, PinnedSlotsAreNeverChosen) {
    ExpertCache c(1, 4, 2);
    c.assign(0, 0, 0);
    c.assign(1, 0, 1);
    c.pin(0);
    c.pin(0);
    c.pin(1);
    EXPECT_EQ(c.n_pinned(), 2u);
    EXPECT_EQ(c.victim(), ExpertCache::kNone);
    c.unpin(0);
    EXPECT_EQ(c.victim(), ExpertCache::kNone);  // pins nest
    c.unpin(0);
    EXPECT_EQ(c.victim(), 0);
    c.unpin(1);
    EXPECT_THROW(c.unpin(1), Error);
}

TEST(ExpertCache, DecayHalvesHotnessAndKeepsTotals) {
    ExpertCache c(2, 2, 1);
    for (int i = 0; i < 5; ++i) c.select(1, 1);
    c.decay();
    EXPECT_EQ(c.hotness(1, 1), 2u);
    c.decay();
    c.decay();
    EXPECT_EQ(c.hotness(1, 1), 0u);
    EXPECT_EQ(c.selection_counts()[1 * 2 + 1], 5u);
}

TEST(ExpertCache, RefusesABadShape) {
    EXPECT_THROW(ExpertCache(0, 4, 1), Error);
    EXPECT_THROW(ExpertCache(1, 4, 0), Error);
}

// Random operations against a brute-force model of the rules.
TEST(ExpertCache, RandomWalkMatchesTheRules) {
    constexpr uint32_t L = 3, E = 5, S = 6;
    ExpertCache c(L, E, S);
    std::vector<int> key(S, -1), pins(S, 0);
    std::vector<uint64_t> used(S, 0);
    std::vector<uint32_t> hot(L * E, 0);
    std::mt19937 rng(3);
    uint64_t tick = 0;
    for (int step = 0; step < 20000; ++step) {
        const int op = rng() % 6;
        const int s = rng() % S;
        const uint32_t l = rng() % L, e = rng() % E;
        if (op == 0) {
            c.select(l, e);
            ++hot[l * E + e];
        } else if (op == 1) {
            c.touch(s, ++tick);
            used[s] = tick;
        } else if (op == 2 && !pins[s]) {
            if (c.slot_of(l, e) == ExpertCache::kNone) {
                c.assign(s, l, e);
                key[s] = int(l * E + e);
            }
        } else if (op == 3) {
            c.pin(s);
            ++pins[s];
        } else if (op == 4 && pins[s]) {
            c.unpin(s);
            --pins[s];
        } else if (op == 5 && rng() % 50 == 0) {
            c.decay();
            for (auto &h : hot) h >>= 1;
        }
        int want = ExpertCache::kNone;
        for (int t = 0; t < int(S); ++t) {
            if (pins[t]) continue;
            if (key[t] < 0) {
                want = t;
                break;
            }
            if (want == ExpertCache::kNone || hot[key[t]] < hot[key[want]] ||
                (hot[key[t]] == hot[key[want]] && used[t] < used[want]))
                want = t;
        }
        ASSERT_EQ(c.victim(), want) << "step " << step;
        if (want != ExpertCache::kNone) {
            ASSERT_FALSE(c.pinned(want));
        }
        for (int t = 0; t < int(S); ++t)
            if (key[t] >= 0) {
                ASSERT_EQ(c.slot_of(key[t] / E, key[t] % E), t);
            }
    }
}

}  // namespace

// ExpertBudget: how a count, a share and a size become cache slots, and which budget is `auto`.
// The expected slots are worked out by hand from the rule stated in expert_budget.h.
#include <gtest/gtest.h>

#include <cmath>

#include "experts/expert_budget.h"

namespace ds4::experts {
namespace {

TEST(ExpertBudget, AllZeroIsAutomaticAndAnyGivenFormIsNot) {
    EXPECT_TRUE(ExpertBudget{}.automatic());
    EXPECT_FALSE((ExpertBudget{.experts = 1}).automatic());
    EXPECT_FALSE((ExpertBudget{.percent = 0.5}).automatic());
    EXPECT_FALSE((ExpertBudget{.bytes = 1}).automatic());
    // A share that is no share (negative, NaN) is no budget given.
    EXPECT_TRUE((ExpertBudget{.percent = -3}).automatic());
    EXPECT_TRUE((ExpertBudget{.percent = std::nan("")}).automatic());
}

TEST(ExpertBudget, ACountIsItsSlotsUncapped) {
    EXPECT_EQ((ExpertBudget{.experts = 2427}).slots(11008, 7077888), 2427u);
    EXPECT_EQ((ExpertBudget{.experts = 20000}).slots(11008, 7077888), 20000u);  // the cache caps
}

TEST(ExpertBudget, AShareRoundsDownToAtLeastOneSlot) {
    EXPECT_EQ((ExpertBudget{.percent = 10}).slots(11008, 7077888), 1100u);  // 1100.8
    EXPECT_EQ((ExpertBudget{.percent = 100}).slots(11008, 7077888), 11008u);
    EXPECT_EQ((ExpertBudget{.percent = 0.001}).slots(11008, 7077888), 1u);  // 0.11
}

TEST(ExpertBudget, ASizeIsItsWholeSlots) {
    const uint64_t slot = 7077888;                                              // 6.75 MiB
    EXPECT_EQ((ExpertBudget{.bytes = 20ull << 30}).slots(11008, slot), 3034u);  // 3034.07
    EXPECT_EQ((ExpertBudget{.bytes = slot - 1}).slots(11008, slot), 0u);  // the floor refuses it
}

TEST(ExpertBudget, ACountComesBeforeAShareAndAShareBeforeASize) {
    EXPECT_EQ((ExpertBudget{.experts = 7, .percent = 50, .bytes = 1ull << 40}).slots(100, 10), 7u);
    EXPECT_EQ((ExpertBudget{.percent = 50, .bytes = 1ull << 40}).slots(100, 10), 50u);
}

}  // namespace
}  // namespace ds4::experts

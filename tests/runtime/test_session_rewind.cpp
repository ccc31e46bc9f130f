// Session::rewind on the tiny synthetic model (window 8, compression ratios 4 and 16, indexer
// top-k 4): after going back to a rewind point and evaluating other tokens, the logits are those
// of a session that evaluated the same tokens from the start, bit for bit. The oracle is the
// cold session: the engine's own forward pass, which the other session tests tie to the
// reference fixtures; what is tested is that a rewind leaves no trace of the abandoned tokens.
#include <gtest/gtest.h>

#include <cstring>

#include "common/error.h"
#include "runtime/session.h"
#include "tiny_session_model.h"

using namespace ds4;
using namespace ds4::runtime;

namespace {

std::unique_ptr<Model> tiny() {
    return Model::load(test::tiny_session_model(11), {.n_threads = 2});
}

std::vector<int32_t> tokens(size_t n, uint32_t mul, uint32_t add) {
    return test::made_up_prompt(n, mul, add);
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t> &b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

void expect_same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// The logits of a session that evaluates `all` from the start in one call.
std::vector<float> cold(Model &m, const std::vector<int32_t> &all, uint32_t chunk = 0) {
    Session s(m, {.ctx = 256, .chunk = chunk});
    return s.eval(all);
}

TEST(SessionRewind, OtherTokensAfterARewindGiveTheColdLogits) {
    auto m = tiny();
    // An interval of 6 puts the points inside compression windows of 4 and 16 and the window
    // of 8, so that the raw ring and both compressors' partial windows must come back.
    for (uint32_t chunk : {1u, 5u, 256u}) {
        Session s(*m, {.ctx = 256, .chunk = chunk, .rewind_interval = 6});
        const auto first = tokens(100, 37, 5);
        s.eval(first);
        ASSERT_EQ(s.rewind_point(70), 66u);
        ASSERT_EQ(s.rewind(70), 66u);
        EXPECT_EQ(s.tokens(), std::vector<int32_t>(first.begin(), first.begin() + 66));
        const auto other = tokens(45, 11, 3);  // crosses the indexer's top-k and 16-windows
        const auto got = s.eval(other);
        const auto all = concat({first.begin(), first.begin() + 66}, other);
        expect_same_bits(got, cold(*m, all));
        // and the next step too
        const std::vector<int32_t> next = {77};
        expect_same_bits(s.eval(next), cold(*m, concat(all, next)));
    }
}

TEST(SessionRewind, ARewindPointHoldsItsLogits) {
    auto m = tiny();
    Session s(*m, {.ctx = 256, .rewind_interval = 8});
    const auto p = tokens(50, 37, 5);
    const auto at50 = s.eval(p);
    s.mark_rewind_point();
    s.eval(tokens(30, 13, 1));
    EXPECT_EQ(s.rewind_point(55), 50u);  // the mark, above the periodic 48 (56 is after 55)
    EXPECT_EQ(s.rewind_point(49), 48u);
    ASSERT_EQ(s.rewind(55), 50u);
    expect_same_bits(s.logits(), at50);
    EXPECT_EQ(s.tokens(), p);
    const auto more = tokens(9, 5, 2);
    expect_same_bits(s.eval(more), cold(*m, concat(p, more)));
}

TEST(SessionRewind, BackToTheStartIsAFreshSession) {
    auto m = tiny();
    Session s(*m, {.ctx = 256});  // no periodic points: only 0 (and a mark)
    s.eval(tokens(40, 37, 5));
    EXPECT_EQ(s.rewind_point(39), 0u);
    EXPECT_EQ(s.rewind(39), 0u);
    EXPECT_TRUE(s.tokens().empty());
    EXPECT_TRUE(s.logits().empty());
    const auto p = tokens(33, 3, 9);
    expect_same_bits(s.eval(p), cold(*m, p));
}

TEST(SessionRewind, RewindingToTheCurrentLengthOrBeyondChangesNothing) {
    auto m = tiny();
    Session s(*m, {.ctx = 256, .rewind_interval = 4});
    const auto p = tokens(21, 37, 5);
    const auto logits = s.eval(p);
    EXPECT_EQ(s.rewind_point(21), 21u);
    EXPECT_EQ(s.rewind(500), 21u);
    EXPECT_EQ(s.tokens(), p);
    expect_same_bits(s.logits(), logits);
    EXPECT_EQ(s.rewind_points(), (std::vector<size_t>{0, 4, 8, 12, 16, 20}));
}

TEST(SessionRewind, TooManyPointsDoubleTheInterval) {
    auto m = tiny();
    Session s(*m, {.ctx = 256, .rewind_interval = 8, .max_rewind_points = 3});
    s.eval(tokens(40, 37, 5));  // 8 16 24, then 32 makes four: every 16th kept
    EXPECT_EQ(s.rewind_points(), (std::vector<size_t>{0, 16, 32}));
    s.eval(tokens(24, 7, 1));  // 48, then 64 makes four again: every 32nd
    EXPECT_EQ(s.rewind_points(), (std::vector<size_t>{0, 32, 64}));
    EXPECT_GT(s.rewind_points_bytes(), 0u);
    EXPECT_LE(s.rewind_points_bytes(),
              3 * Session::rewind_point_bytes_for(m->hparams(), {.ctx = 256}));
    // A rewind drops the points after it; the interval stays doubled.
    EXPECT_EQ(s.rewind(40), 32u);
    EXPECT_EQ(s.rewind_points(), (std::vector<size_t>{0, 32}));
    s.eval(tokens(40, 3, 3));  // 64 again (48 is no multiple of 32 now)
    EXPECT_EQ(s.rewind_points(), (std::vector<size_t>{0, 32, 64}));
}

TEST(SessionRewind, RestoreAndReadStateKeepOnlyTheStart) {
    auto m = tiny();
    Session s(*m, {.ctx = 256, .rewind_interval = 4});
    s.eval(tokens(10, 37, 5));
    const Session::Snapshot snap = s.save();
    s.eval(tokens(10, 5, 5));
    s.mark_rewind_point();
    s.restore(snap);
    EXPECT_EQ(s.rewind_points(), (std::vector<size_t>{0}));
    // A point of the abandoned history cannot be used: the only way back is the start.
    EXPECT_EQ(s.rewind(9), 0u);
}

TEST(SessionRewind, PeriodicPointsNeedRoom) {
    auto m = tiny();
    EXPECT_THROW(Session(*m, {.ctx = 64, .rewind_interval = 4, .max_rewind_points = 0}), Error);
}

}  // namespace

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "server/stop_matcher.h"

using ds4::server::StopMatcher;

namespace {

// Feeds `pieces` and returns everything shown.
std::string run(StopMatcher &m, const std::vector<std::string> &pieces) {
    std::string out;
    for (const auto &p : pieces) out += m.push(p);
    return out + m.finish();
}

}  // namespace

TEST(StopMatcher, NoStopsPassesEverythingAtOnce) {
    StopMatcher m({});
    EXPECT_EQ(m.push("abc"), "abc");
    EXPECT_EQ(m.finish(), "");
    EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, CutsBeforeTheStopWithinAPiece) {
    StopMatcher m({"END"});
    EXPECT_EQ(m.push("hello END world"), "hello ");
    EXPECT_TRUE(m.stopped());
    EXPECT_EQ(m.push("more"), "");
    EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, HoldsAPossibleStartUntilResolved) {
    StopMatcher m({"END"});
    EXPECT_EQ(m.push("abc E"), "abc ");  // "E" may start END
    EXPECT_EQ(m.push("N"), "");          // "EN" still may
    EXPECT_EQ(m.push("x"), "ENx");       // resolved: not a stop
    EXPECT_EQ(m.push("EN"), "");
    EXPECT_EQ(m.push("D!"), "");
    EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, EarliestOfSeveralWins) {
    StopMatcher m({"world", "lo w"});
    EXPECT_EQ(run(m, {"hel", "lo wor", "ld"}), "hel");
    EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, HeldTailReleasedAtTheEnd) {
    StopMatcher m({"ab"});
    EXPECT_EQ(m.push("xxa"), "xx");
    EXPECT_EQ(m.finish(), "a");
}

TEST(StopMatcher, OverlappingPrefixes) {
    StopMatcher m({"aab"});
    EXPECT_EQ(run(m, {"a", "a", "a", "b", "c"}), "a");
    EXPECT_TRUE(m.stopped());
}

// Any split of a text into pieces shows the text cut before its first stop, and never shows a
// byte that the cut removes.
TEST(StopMatcher, RandomSplitsAgreeWithFind) {
    std::mt19937 rng(7);
    const std::vector<std::string> stops = {"abc", "ca", "bbb"};
    for (int iter = 0; iter < 2000; ++iter) {
        std::string text;
        const int n = rng() % 30;
        for (int i = 0; i < n; ++i) text += char('a' + rng() % 3);
        size_t cut = std::string::npos;
        for (const auto &s : stops) cut = std::min(cut, text.find(s));
        const std::string want = cut == std::string::npos ? text : text.substr(0, cut);
        StopMatcher m(stops);
        std::string shown;
        for (size_t i = 0; i < text.size();) {
            const size_t len = 1 + rng() % 4;
            shown += m.push(text.substr(i, len));
            ASSERT_EQ(want.compare(0, shown.size(), shown), 0) << text;
            i += len;
        }
        shown += m.finish();
        EXPECT_EQ(shown, want) << text;
        EXPECT_EQ(m.stopped(), cut != std::string::npos) << text;
    }
}

TEST(StopMatcher, TellsWhichSequenceStopped) {
    StopMatcher m({"zz", "b", "ab"});
    EXPECT_EQ(m.matched(), "");
    EXPECT_EQ(run(m, {"xa", "bzz"}), "x");  // "ab" starts before "b" and "zz"
    EXPECT_EQ(m.matched(), "ab");
    StopMatcher tie({"cd", "c"});
    EXPECT_EQ(run(tie, {"xcd"}), "x");  // both start at 1: the first listed
    EXPECT_EQ(tie.matched(), "cd");
}

// Saved routing popularity: a round trip through the file, every kind of bad file ignored with a
// notice, random bytes and mutations of a good file never crashing the parser, the identity of a
// model file, and the preload order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "common/error.h"
#include "experts/popularity.h"

using namespace ds4;
using namespace ds4::experts;

namespace {

Popularity sample() {
    Popularity p;
    p.identity = "size=123 mtime=1.000000002 path=00000000deadbeef";
    p.n_layer = 3;
    p.n_expert = 4;
    p.counts = {0, 5, 0, 1, 7, 0, 0, 0, 0, 2, 18446744073709551615ull, 3};
    return p;
}

// Per process: ctest runs test processes side by side.
std::string temp(const std::string &name) {
    return ::testing::TempDir() + "/" + std::to_string(::getpid()) + "-" + name;
}

void write(const std::string &path, const std::string &text) {
    std::ofstream(path, std::ios::binary) << text;
}

TEST(Popularity, RoundTripThroughAFile) {
    const Popularity p = sample();
    const std::string path = temp("experts-pop/sub/round.txt");
    std::filesystem::remove_all(temp("experts-pop"));
    save_popularity(path, p);  // creates the folders
    const LoadedPopularity r = load_popularity(path, p.identity, 3, 4);
    ASSERT_TRUE(r.counts) << r.notice;
    EXPECT_EQ(*r.counts, p.counts);
    EXPECT_NE(r.notice.find("6 experts"), std::string::npos) << r.notice;
    std::filesystem::remove_all(temp("experts-pop"));
}

TEST(Popularity, TheTextIsTheDocumentedFormat) {
    const std::string t = popularity_to_text(sample());
    EXPECT_EQ(t.substr(0, 24), "ds4-expert-popularity 1\n");
    EXPECT_NE(t.find("\nshape 3 4\n"), std::string::npos);
    EXPECT_NE(t.find("\ncount 2 2 18446744073709551615\n"), std::string::npos);
    EXPECT_EQ(t.substr(t.size() - 6), "end 6\n");
}

TEST(Popularity, AnotherFileOrShapeIsIgnored) {
    const Popularity p = sample();
    const std::string path = temp("experts-pop-other.txt");
    save_popularity(path, p);
    LoadedPopularity r = load_popularity(path, "size=124 mtime=1.0 path=0", 3, 4);
    EXPECT_FALSE(r.counts);
    EXPECT_NE(r.notice.find("another model file"), std::string::npos) << r.notice;
    r = load_popularity(path, p.identity, 4, 4);
    EXPECT_FALSE(r.counts);
    EXPECT_NE(r.notice.find("layers"), std::string::npos) << r.notice;
    r = load_popularity(temp("experts-pop-missing.txt"), p.identity, 3, 4);
    EXPECT_FALSE(r.counts);
    EXPECT_NE(r.notice.find("no saved"), std::string::npos) << r.notice;
    std::filesystem::remove(path);
}

TEST(Popularity, CorruptFilesAreIgnoredWithTheReason) {
    const std::string good = popularity_to_text(sample());
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"", "header"},
        {"garbage\n", "not \"ds4-expert-popularity 1\""},
        {"ds4-expert-popularity 2\n" + good.substr(24), "not \"ds4-expert"},
        {good.substr(0, good.size() - 6), "cut short"},
        {good.substr(0, good.size() - 1), "no line break"},
        {good + "count 0 0 1\n", "after the end"},
        {std::string(good).replace(good.find("end 6"), 5, "end 5"), "end says 5"},
        {std::string(good).replace(good.find("count 0 1 5"), 11, "count 0 9 5"), "outside"},
        {std::string(good).replace(good.find("count 0 1 5"), 11, "count 0 3 5"), "twice"},
        {std::string(good).replace(good.find("count 0 1 5"), 11, "count 0 1 -5"), "expected"},
        {std::string(good).replace(good.find("count 0 1 5"), 11, "count 0  1 5"), "expected"},
        {std::string(good).replace(good.find("shape 3 4"), 9, "shape 0 4"), "implausible"},
        {std::string(good).replace(good.find("shape 3 4"), 9, "shape 99999 99999"), "implausible"},
        {std::string(good).replace(good.find("count 2 2 18446744073709551615"), 30,
                                   "count 2 2 18446744073709551616"),
         "expected"},
    };
    const std::string path = temp("experts-pop-bad.txt");
    for (const auto &[text, why] : bad) {
        write(path, text);
        const LoadedPopularity r = load_popularity(path, sample().identity, 3, 4);
        EXPECT_FALSE(r.counts) << text;
        EXPECT_NE(r.notice.find("ignoring"), std::string::npos) << r.notice;
        EXPECT_NE(r.notice.find(why), std::string::npos) << r.notice << " for\n" << text;
    }
    std::filesystem::remove(path);
}

// Random bytes, and random edits of a good file, either parse to a consistent table or are
// refused; never a crash or a huge allocation (the ASan build runs this).
TEST(Popularity, ParserSurvivesRandomInput) {
    const std::string good = popularity_to_text(sample());
    std::mt19937_64 rng(9);
    const std::string alphabet = "0123456789 \n-+abcdeghnpst";
    int parsed = 0;
    for (int i = 0; i < 20000; ++i) {
        std::string t;
        if (i % 2 == 0) {
            t.resize(rng() % 200);
            for (char &c : t) c = i % 4 == 0 ? char(rng()) : alphabet[rng() % alphabet.size()];
        } else {
            t = good;
            for (int k = 1 + rng() % 4; k > 0; --k) {
                const size_t at = rng() % (t.size() + 1);
                switch (rng() % 3) {
                    case 0:
                        if (at < t.size()) t[at] = alphabet[rng() % alphabet.size()];
                        break;
                    case 1:
                        if (at < t.size()) t.erase(at, 1 + rng() % 8);
                        break;
                    default:
                        t.insert(at, 1, alphabet[rng() % alphabet.size()]);
                }
            }
        }
        std::string why;
        const auto p = popularity_from_text(t, &why);
        if (p) {
            ++parsed;
            ASSERT_EQ(p->counts.size(), uint64_t(p->n_layer) * p->n_expert);
            // What parses prints back to text that parses to the same table.
            const auto again = popularity_from_text(popularity_to_text(*p), nullptr);
            ASSERT_TRUE(again);
            ASSERT_EQ(again->counts, p->counts);
        } else {
            ASSERT_FALSE(why.empty());
        }
    }
    EXPECT_GT(parsed, 0);  // some edits (a digit of a count) keep the file valid
}

TEST(Popularity, IdentityChangesWithTheFile) {
    const std::string path = temp("experts-identity.bin");
    write(path, "abc");
    const std::string a = file_identity(path);
    EXPECT_EQ(a, file_identity(path));
    EXPECT_NE(a.find("size=3 "), std::string::npos) << a;
    write(path, "abcd");
    EXPECT_NE(a, file_identity(path));
    EXPECT_THROW(file_identity(temp("experts-no-such-file")), Error);
    std::filesystem::remove(path);
}

TEST(Popularity, PopularFirstOrdersByCountThenKey) {
    const Popularity p = sample();
    const std::vector<ExpertKey> k = popular_first(p.counts, p.n_expert, 4);
    ASSERT_EQ(k.size(), 4u);
    EXPECT_EQ(k[0].layer, 2u);  // the largest count
    EXPECT_EQ(k[0].expert, 2u);
    EXPECT_EQ(k[1].layer, 1u);  // 7
    EXPECT_EQ(k[1].expert, 0u);
    EXPECT_EQ(k[2].layer, 0u);  // 5
    EXPECT_EQ(k[2].expert, 1u);
    EXPECT_EQ(k[3].layer, 2u);  // 3
    EXPECT_EQ(k[3].expert, 3u);
    EXPECT_EQ(popular_first(p.counts, p.n_expert, 100).size(), 6u);
}

TEST(Popularity, AnIdentityWithALineBreakIsRefused) {
    Popularity p = sample();
    p.identity += "\nshape 1 1";
    EXPECT_THROW(popularity_to_text(p), Error);
}

}  // namespace

// Our tokenizer against HF `tokenizers` (the oracle) on the committed 20k-string corpus, plus the
// properties every encoding must have: decode(encode(s)) == s, and the same ids from many threads.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <thread>

#include "tokenizer_fixtures.h"

namespace ds4::tokenizer {
namespace {

using testing::load_corpus;
using testing::v4_tokenizer;

std::vector<int32_t> encode_case(const Tokenizer &tok, const testing::CorpusCase &c) {
    return c.chat ? tok.encode_chat_text(c.text) : tok.encode(c.text);
}

TEST(TokenizerCorpus, HasTheAdvertisedSize) {
    EXPECT_GE(load_corpus().size(), 20000u);
}

TEST(TokenizerCorpus, MatchesHfTokenizersOnEveryString) {
    const Tokenizer &tok = v4_tokenizer();
    size_t failures = 0;
    for (const auto &c : load_corpus()) {
        const auto ids = encode_case(tok, c);
        if (ids != c.ids && ++failures <= 10) {
            ADD_FAILURE() << "text (hex) " << testing::hex(c.text) << "\n  text: " << c.text
                          << "\n  ours: " << fmt::format("{}", ids)
                          << "\n  hf:   " << fmt::format("{}", c.ids);
        }
    }
    EXPECT_EQ(failures, 0u);
}

TEST(TokenizerCorpus, DecodeOfEncodeIsTheInputForAllBytes) {
    // Holds for invalid UTF-8 too: invalid bytes become their single-byte tokens.
    const Tokenizer &tok = v4_tokenizer();
    for (const auto &c : load_corpus()) {
        ASSERT_EQ(tok.decode(encode_case(tok, c)), c.text) << testing::hex(c.text);
    }
}

TEST(TokenizerCorpus, SameIdsFromFourThreadsAtOnce) {
    const Tokenizer &tok = v4_tokenizer();
    const auto corpus = load_corpus();
    std::vector<size_t> mismatches(4, 0);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            for (size_t i = t; i < corpus.size(); i += 2) {  // overlapping halves
                if (encode_case(tok, corpus[i]) != corpus[i].ids) ++mismatches[t];
            }
        });
    }
    for (auto &th : threads) th.join();
    EXPECT_EQ(mismatches, std::vector<size_t>(4, 0));
}

TEST(TokenizerPlainText, SpecialTokenStringsAreOrdinaryText) {
    // The CLI encodes user text without special-token recognition (docs/MODEL.md 7.2).
    const Tokenizer &tok = v4_tokenizer();
    const auto plain = tok.encode("<think>");
    EXPECT_GT(plain.size(), 1u);
    EXPECT_EQ(tok.decode(plain), "<think>");
    EXPECT_EQ(tok.encode_chat_text("<think>"), std::vector<int32_t>{tok.specials().think_open});
}

}  // namespace
}  // namespace ds4::tokenizer

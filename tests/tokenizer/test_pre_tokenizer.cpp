// The pre-tokenizer against HF's (the oracle): edge-case strings piece by piece, and the Unicode
// class of every code point through a probe string (fixtures from scripts/tokenizer_fixtures.py).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode_class.h"
#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace ds4::tokenizer {
namespace {

std::vector<std::string> pieces_of(std::string_view text) {
    std::vector<std::string_view> views;
    pre_tokenize(text, views);
    return {views.begin(), views.end()};
}

TEST(PreTokenizer, MatchesHfPiecesOnEdgeCases) {
    std::istringstream lines(testing::read_bytes(testing::fixture_path("pretokenize.jsonl")));
    size_t n = 0;
    for (std::string line; std::getline(lines, line); ++n) {
        const auto j = nlohmann::json::parse(line);
        const auto text = j["text"].get<std::string>();
        EXPECT_EQ(pieces_of(text), j["pieces"].get<std::vector<std::string>>()) << "text: " << text;
    }
    EXPECT_GT(n, 40u);
}

std::string probe(char32_t c) {
    // Must match probe() in scripts/tokenizer_fixtures.py.
    std::string s;
    auto add = [&](std::string_view ascii) { s += ascii; };
    auto cp = [&](int times) {
        for (int i = 0; i < times; ++i) utf8_append(s, c);
    };
    add("a");
    cp(1);
    add("a0!");
    cp(2);
    add("!0");
    cp(4);
    add("0 ");
    cp(1);
    add("x");
    return s;
}

std::string signature(char32_t c) {
    const std::string text = probe(c);
    std::vector<std::string_view> pieces;
    pre_tokenize(text, pieces);
    std::string sig;
    for (std::string_view p : pieces) {
        size_t chars = 0;
        for (char b : p) chars += (static_cast<uint8_t>(b) & 0xC0) != 0x80;
        sig += fmt::format("{}{}", sig.empty() ? "" : ",", chars);
    }
    return sig;
}

TEST(PreTokenizer, UnicodeClassesOfEveryCodePointMatchHf) {
    std::istringstream lines(testing::read_bytes(testing::fixture_path("unicode_classes.txt")));
    size_t checked = 0;
    std::vector<std::string> mismatched_assigned;
    size_t unassigned_here = 0;
    for (std::string line; std::getline(lines, line);) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream fields(line);
        uint32_t first = 0, last = 0;
        std::string expected;
        fields >> std::hex >> first >> last >> expected;
        for (char32_t c = first; c <= last; ++c) {
            if (c >= 0xD800 && c <= 0xDFFF) continue;
            ++checked;
            if (signature(c) == expected) continue;
            // Characters our Unicode data does not know (utf8proc plus unicode_additions.inc
            // older than the oracle's Unicode version) are counted separately: regenerate the
            // additions with scripts/tokenizer_unicode_additions.py.
            if (char_class(c) == 0 && c > 0x7F) {
                ++unassigned_here;
            } else if (mismatched_assigned.size() < 20) {
                mismatched_assigned.push_back(fmt::format(
                    "U+{:04X}: ours {} hf {}", static_cast<uint32_t>(c), signature(c), expected));
            }
        }
    }
    EXPECT_EQ(checked, 0x110000u - 0x800u);
    EXPECT_TRUE(mismatched_assigned.empty())
        << fmt::format("{}", fmt::join(mismatched_assigned, "\n"));
    EXPECT_EQ(unassigned_here, 0u) << "code points assigned in the oracle's Unicode version but "
                                      "unknown to our Unicode data";
}

TEST(PreTokenizer, InvalidBytesArePiecesOfTheirOwn) {
    EXPECT_EQ(pieces_of("ab\xff"
                        "cd"),
              (std::vector<std::string>{"ab", "\xff", "cd"}));
    EXPECT_EQ(pieces_of("\xe2\x82 x"), (std::vector<std::string>{"\xe2", "\x82", " x"}));
    EXPECT_EQ(pieces_of("\xed\xa0\x80"), (std::vector<std::string>{"\xed", "\xa0", "\x80"}));
}

TEST(PreTokenizer, PiecesConcatenateToTheInput) {
    const std::string text = "x = 12345; // café 你好 😀\r\n\t  end \xc3";
    std::string joined;
    for (const auto &p : pieces_of(text)) {
        EXPECT_FALSE(p.empty());
        joined += p;
    }
    EXPECT_EQ(joined, text);
}

}  // namespace
}  // namespace ds4::tokenizer

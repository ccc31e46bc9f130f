// UTF-8 handling: the strict decoder, the byte-level alphabet, and the streaming decoder that
// never emits a partial character.
#include <gtest/gtest.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace ds4::tokenizer {
namespace {

TEST(Utf8, RejectsOverlongSurrogateAndOutOfRangeForms) {
    // Unicode Table 3-7 (well-formed byte sequences).
    EXPECT_TRUE(utf8_is_valid("a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf"));
    for (std::string bad :
         {"\xc0\xaf", "\xc1\xbf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf0\x80\x80\xaf",
          "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\x80", "\xe2\x82", "\xff"}) {
        EXPECT_FALSE(utf8_is_valid(bad)) << testing::hex(bad);
    }
}

TEST(Utf8, CompletePrefixHoldsOnlyWhatCanStillBecomeACharacter) {
    EXPECT_EQ(utf8_complete_prefix("ab\xe2\x82"), 2u);  // € still coming
    EXPECT_EQ(utf8_complete_prefix("ab\xe2\x82\xac"), 5u);
    EXPECT_EQ(utf8_complete_prefix("ab\xf0\x9f\x98"), 2u);
    EXPECT_EQ(utf8_complete_prefix("ab\xed\xa0"), 4u);  // surrogate: can never complete
    EXPECT_EQ(utf8_complete_prefix("ab\xff"), 3u);      // invalid: passed through
    EXPECT_EQ(utf8_complete_prefix("\x80\x80"), 2u);
    EXPECT_EQ(utf8_complete_prefix(""), 0u);
}

TEST(ByteLevel, AlphabetIsGpt2s) {
    // Facts visible in the vocabulary: space is 'Ġ' (U+0120), newline 'Ċ' (U+010A).
    EXPECT_EQ(byte_to_code_point(' '), U'\u0120');
    EXPECT_EQ(byte_to_code_point('\n'), U'\u010A');
    EXPECT_EQ(byte_to_code_point('A'), U'A');
    EXPECT_EQ(byte_to_code_point(0xAD), U'\u0143');  // the last remapped byte
    for (unsigned b = 0; b < 256; ++b) {
        EXPECT_EQ(code_point_to_byte(byte_to_code_point(static_cast<uint8_t>(b))), b);
    }
    EXPECT_EQ(byte_level_decode("<｜User｜>"), std::nullopt);
}

TEST(StreamDecoder, EmitsWholeCharactersAndLosesNothing) {
    const Tokenizer &tok = testing::v4_tokenizer();
    size_t held_back = 0;
    for (const auto &c : testing::load_corpus()) {
        StreamDecoder dec(tok);
        std::string joined;
        for (int32_t id : c.ids) {
            const std::string chunk = dec.push(id);
            if (utf8_is_valid(c.text)) {
                ASSERT_TRUE(utf8_is_valid(chunk)) << testing::hex(c.text);
            }
            held_back += dec.has_pending();
            joined += chunk;
        }
        joined += dec.flush();
        ASSERT_EQ(joined, tok.decode(c.ids));
    }
    EXPECT_GT(held_back, 100u);  // the corpus does split characters across tokens
}

TEST(StreamDecoder, HoldsASplitEmojiUntilItsLastByte) {
    const Tokenizer &tok = testing::v4_tokenizer();
    const auto ids = tok.encode("🫠");  // a rare emoji: byte-level pieces
    ASSERT_GT(ids.size(), 1u);
    StreamDecoder dec(tok);
    std::string out;
    for (size_t i = 0; i + 1 < ids.size(); ++i) out += dec.push(ids[i]);
    EXPECT_EQ(out, "");
    EXPECT_EQ(dec.push(ids.back()), "🫠");
    EXPECT_EQ(dec.flush(), "");
}

}  // namespace
}  // namespace ds4::tokenizer

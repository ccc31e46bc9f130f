// Loading the vocabulary: the committed V4 GGUF against HF's facts (ids of the chat specials,
// sizes, decoded tokens), the in-memory constructor on a toy vocabulary against HF's ids, and the
// errors for vocabularies we cannot use.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer_fixtures.h"

namespace ds4::tokenizer {
namespace {

using testing::v4_tokenizer;

nlohmann::json vocab_facts() {
    return nlohmann::json::parse(testing::read_bytes(testing::fixture_path("vocab_facts.json")));
}

TEST(Vocabulary, SizesMatchHf) {
    const auto facts = vocab_facts();
    EXPECT_EQ(v4_tokenizer().n_tokens(), facts["n_tokens"].get<size_t>());
    EXPECT_EQ(v4_tokenizer().n_merges(), 127741u);  // the merges list of the V4 tokenizer.json
}

TEST(Vocabulary, ChatSpecialIdsAreTheV4Ones) {
    const auto expected = vocab_facts()["specials"];
    const ChatSpecialIds &s = v4_tokenizer().specials();
    EXPECT_EQ(s.bos, expected[std::string(kBosText)].get<int32_t>());
    EXPECT_EQ(s.eos, expected[std::string(kEosText)].get<int32_t>());
    EXPECT_EQ(s.user, expected[std::string(kUserText)].get<int32_t>());
    EXPECT_EQ(s.assistant, expected[std::string(kAssistantText)].get<int32_t>());
    EXPECT_EQ(s.think_open, expected[std::string(kThinkOpenText)].get<int32_t>());
    EXPECT_EQ(s.think_close, expected[std::string(kThinkCloseText)].get<int32_t>());
    EXPECT_EQ(s.dsml, expected[std::string(kDsmlText)].get<int32_t>());
    // The values docs/MODEL.md section 6 gives, which the oracle confirms.
    EXPECT_EQ(std::vector<int32_t>(
                  {s.bos, s.eos, s.user, s.assistant, s.think_open, s.think_close, s.dsml}),
              std::vector<int32_t>({0, 1, 128803, 128804, 128821, 128822, 128825}));
}

TEST(Vocabulary, DecodedTokensMatchHf) {
    const Tokenizer &tok = v4_tokenizer();
    size_t n = 0;
    const auto facts = vocab_facts();
    for (const auto &entry : facts["decoded"]) {
        const int32_t id = entry[0].get<int32_t>();
        EXPECT_EQ(testing::hex(tok.token_bytes(id)), entry[1].get<std::string>()) << "id " << id;
        ++n;
    }
    EXPECT_GT(n, 2000u);
}

TEST(Vocabulary, GgufMetadataIsTheLlamaCppLayout) {
    auto file = gguf::File::open(testing::source_path("models/ds4-vocab.gguf"));
    EXPECT_EQ(file->get_string("general.architecture"), "deepseek4");
    EXPECT_EQ(file->get_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(file->get_string("tokenizer.ggml.pre"), "joyai-llm");
    EXPECT_EQ(file->get_u32("tokenizer.ggml.bos_token_id"), 0u);
    EXPECT_EQ(file->get_u32("tokenizer.ggml.eos_token_id"), 1u);
    EXPECT_EQ(v4_tokenizer().token_type(0), TokenType::kControl);
    EXPECT_EQ(v4_tokenizer().token_type(128821), TokenType::kUserDefined);
    EXPECT_EQ(v4_tokenizer().token_type(100), TokenType::kNormal);
}

Vocabulary toy_vocabulary(const nlohmann::json &toy) {
    Vocabulary v;
    v.tokens = toy["tokens"].get<std::vector<std::string>>();
    v.merges = toy["merges"].get<std::vector<std::string>>();
    return v;
}

TEST(Vocabulary, ToyVocabularyFromMemoryMatchesHf) {
    const auto toy =
        nlohmann::json::parse(testing::read_bytes(testing::fixture_path("toy_bpe.json")));
    const Tokenizer tok(toy_vocabulary(toy));
    for (const auto &c : toy["cases"]) {
        const auto text = c[0].get<std::string>();
        EXPECT_EQ(tok.encode(text), c[1].get<std::vector<int32_t>>()) << "text '" << text << "'";
    }
}

TEST(Vocabulary, MissingChatSpecialsAreNamed) {
    const auto toy =
        nlohmann::json::parse(testing::read_bytes(testing::fixture_path("toy_bpe.json")));
    Vocabulary v = toy_vocabulary(toy);
    v.tokens.resize(v.tokens.size() - 3);  // drops </think>, <think> ... like a V3 vocabulary
    try {
        Tokenizer tok(v);
        FAIL() << "expected ds4::Error";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("<think>"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("｜DSML｜"), std::string::npos) << e.what();
    }
}

TEST(Vocabulary, MergeOutsideTheVocabularyIsRejected) {
    const auto toy =
        nlohmann::json::parse(testing::read_bytes(testing::fixture_path("toy_bpe.json")));
    Vocabulary v = toy_vocabulary(toy);
    v.merges.push_back("ab ca");  // "abca" is not a token
    EXPECT_THROW(Tokenizer tok(v), Error);
    v.merges.back() = "abca";  // not "A B"
    EXPECT_THROW(Tokenizer tok(v), Error);
}

std::unique_ptr<gguf::File> gguf_with(const std::string &pre, std::vector<uint8_t> &storage) {
    const auto toy =
        nlohmann::json::parse(testing::read_bytes(testing::fixture_path("toy_bpe.json")));
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::string("deepseek4"));
    w.set("tokenizer.ggml.model", gguf::Value::string("gpt2"));
    w.set("tokenizer.ggml.pre", gguf::Value::string(pre));
    w.set("tokenizer.ggml.tokens",
          gguf::Value::array_of_strings(toy["tokens"].get<std::vector<std::string>>()));
    w.set("tokenizer.ggml.merges",
          gguf::Value::array_of_strings(toy["merges"].get<std::vector<std::string>>()));
    storage = w.to_bytes();
    return gguf::File::from_memory(storage.data(), storage.size(), "toy.gguf");
}

TEST(Vocabulary, LoadsFromAGgufAndRejectsOtherPreTokenizers) {
    std::vector<uint8_t> bytes;
    EXPECT_NO_THROW(Tokenizer tok(load_vocabulary(*gguf_with("deepseek-v3", bytes))));
    try {
        load_vocabulary(*gguf_with("llama-bpe", bytes));
        FAIL() << "expected ds4::Error";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("llama-bpe"), std::string::npos) << e.what();
    }
}

TEST(Vocabulary, OutOfRangeIdsThrow) {
    EXPECT_THROW(v4_tokenizer().token_bytes(-1), Error);
    EXPECT_THROW(v4_tokenizer().token_bytes(129280), Error);
}

}  // namespace
}  // namespace ds4::tokenizer

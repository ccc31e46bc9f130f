#include <gtest/gtest.h>

#include <string>

#include "server/anthropic_request.h"
#include "server/api_error.h"

using ds4::server::ApiError;
using ds4::server::MessagesBody;
using ds4::server::parse_messages_request;
using ds4::tokenizer::ThinkMode;

namespace {

// The ApiError a body gets ("" when it parses).
std::string error_of(const std::string &body, MessagesBody kind = MessagesBody::Create) {
    try {
        parse_messages_request(body, kind);
        return "";
    } catch (const ApiError &e) {
        EXPECT_EQ(e.status, 400) << body;
        return e.what();
    }
}

const std::string kUser = R"("messages":[{"role":"user","content":"x"}])";

}  // namespace

TEST(AnthropicRequest, Fields) {
    const auto r = parse_messages_request(R"({"model":"m","max_tokens":7,
        "system":[{"type":"text","text":"x-anthropic-billing-header: cc=1"},
                  {"type":"text","text":"S1","cache_control":{"type":"ephemeral"}},
                  {"type":"text","text":"S2"}],
        "messages":[
          {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
          {"role":"assistant","content":[{"type":"thinking","thinking":"T","signature":"s"},
                                         {"type":"redacted_thinking","data":"zz"},
                                         {"type":"text","text":"A"}]},
          {"role":"user","content":"q"}],
        "temperature":0,"top_p":0.5,"top_k":3,"stop_sequences":["x",""],"stream":true,
        "metadata":{"user_id":"u"},"tool_choice":{"type":"auto"}})");
    EXPECT_EQ(r.endpoint, ds4::server::Endpoint::Chat);
    EXPECT_EQ(r.model, "m");
    ASSERT_EQ(r.messages.size(), 4u);
    EXPECT_EQ(r.messages[0].role, "system");
    EXPECT_EQ(r.messages[0].content, "S1\nS2");  // the x-anthropic- block dropped
    EXPECT_EQ(r.messages[1].content, "ab");
    EXPECT_EQ(r.messages[2].role, "assistant");
    EXPECT_EQ(r.messages[2].content, "A");
    EXPECT_EQ(r.messages[2].reasoning, "T");
    EXPECT_EQ(r.messages[3].content, "q");
    EXPECT_TRUE(r.assistant_prefill.empty());
    EXPECT_EQ(r.max_tokens, 7);
    EXPECT_EQ(r.sampling.temperature, 0.0f);
    EXPECT_EQ(r.sampling.top_p, 0.5f);
    EXPECT_EQ(r.sampling.top_k, 3);
    EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
    EXPECT_TRUE(r.stream);
    EXPECT_EQ(r.think, ThinkMode::kNone);
}

TEST(AnthropicRequest, SystemStringAndNoSystem) {
    auto r = parse_messages_request(R"({"max_tokens":1,"system":"Be brief.",)" + kUser + "}");
    ASSERT_EQ(r.messages.size(), 2u);
    EXPECT_EQ(r.messages[0].role, "system");
    EXPECT_EQ(r.messages[0].content, "Be brief.");
    r = parse_messages_request(R"({"max_tokens":1,"system":"",)" + kUser + "}");
    ASSERT_EQ(r.messages.size(), 1u);
    EXPECT_EQ(r.messages[0].role, "user");
}

TEST(AnthropicRequest, LastAssistantMessageIsAPrefill) {
    const auto r = parse_messages_request(R"({"max_tokens":5,"messages":[
        {"role":"user","content":"q"},{"role":"assistant","content":[{"type":"text","text":"Sì, "}]}]})");
    ASSERT_EQ(r.messages.size(), 1u);
    EXPECT_EQ(r.messages[0].role, "user");
    EXPECT_EQ(r.assistant_prefill, "Sì, ");
    EXPECT_NE(error_of(R"({"max_tokens":5,"messages":[{"role":"assistant","content":"a"}]})"), "");
    EXPECT_NE(
        error_of(
            R"({"max_tokens":5,"system":"s","messages":[{"role":"assistant","content":"a"}]})"),
        "");
    EXPECT_NE(error_of(R"({"max_tokens":5,"thinking":{"type":"enabled","budget_tokens":100},
        "messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]})")
                  .find("thinking"),
              std::string::npos);
}

TEST(AnthropicRequest, Thinking) {
    const auto body = [](const std::string &extra) {
        return R"({"max_tokens":1,)" + kUser + "," + extra + "}";
    };
    EXPECT_EQ(
        parse_messages_request(body(R"("thinking":{"type":"enabled","budget_tokens":1024})")).think,
        ThinkMode::kHigh);
    EXPECT_EQ(parse_messages_request(body(R"("thinking":{"type":"disabled"})")).think,
              ThinkMode::kNone);
    EXPECT_EQ(parse_messages_request(body(R"("model":"deepseek-reasoner")")).think,
              ThinkMode::kHigh);
    EXPECT_EQ(parse_messages_request(body(R"("thinking":{"type":"adaptive"})")).think,
              ThinkMode::kHigh);
    EXPECT_EQ(parse_messages_request(body(R"("output_config":{"effort":"max"})")).think,
              ThinkMode::kMax);
    EXPECT_EQ(parse_messages_request(
                  body(R"("output_config":{"effort":"high"},"thinking":{"type":"disabled"})"))
                  .think,
              ThinkMode::kNone);
    EXPECT_NE(error_of(body(R"("thinking":{"type":"sometimes"})")), "");
    EXPECT_NE(error_of(body(R"("output_config":{"effort":"huge"})")).find("output_config.effort"),
              std::string::npos);
    EXPECT_NE(error_of(body(R"("output_config":"high")")), "");
}

TEST(AnthropicRequest, MaxTokensIsRequiredAndPositive) {
    EXPECT_NE(error_of("{" + kUser + "}").find("max_tokens"), std::string::npos);
    EXPECT_NE(error_of(R"({"max_tokens":null,)" + kUser + "}"), "");
    EXPECT_NE(error_of(R"({"max_tokens":0,)" + kUser + "}").find("at least 1"), std::string::npos);
    EXPECT_NE(error_of(R"({"max_tokens":-3,)" + kUser + "}"), "");
    EXPECT_NE(error_of(R"({"max_tokens":2.5,)" + kUser + "}"), "");
    EXPECT_EQ(parse_messages_request(R"({"max_tokens":99999999999,)" + kUser + "}").max_tokens,
              2147483647);
    // count_tokens has no max_tokens.
    EXPECT_EQ(error_of("{" + kUser + "}", MessagesBody::CountTokens), "");
}

TEST(AnthropicRequest, UnsupportedBlocksAreRefusedToolsAccepted) {
    const auto with_block = [](const std::string &block) {
        return R"({"max_tokens":1,"messages":[{"role":"user","content":[)" + block + "]}]}";
    };
    EXPECT_NE(
        error_of(
            with_block(
                R"({"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA"}})"))
            .find("image blocks are not supported"),
        std::string::npos);
    EXPECT_NE(error_of(with_block(R"({"type":"document","source":{}})")).find("document"),
              std::string::npos);
    EXPECT_NE(error_of(with_block(R"({"type":"server_tool_use","id":"t","name":"web_search"})"))
                  .find("server tools"),
              std::string::npos);
    EXPECT_EQ(error_of(with_block(R"({"type":"tool_result","tool_use_id":"t","content":"r"})")),
              "");
    EXPECT_NE(error_of(with_block(R"({"type":"hologram"})")).find("hologram"), std::string::npos);
    EXPECT_EQ(
        error_of(R"({"max_tokens":1,"tools":[{"name":"f","input_schema":{}}],)" + kUser + "}"), "");
    EXPECT_EQ(error_of(R"({"max_tokens":1,"tools":[],)" + kUser + "}"), "");
}

TEST(AnthropicRequest, BadBodiesAre400) {
    for (
        const char *b :
        {"",
         "{",
         "[]",
         R"({"max_tokens":1})",
         R"({"max_tokens":1,"messages":[]})",
         R"({"max_tokens":1,"messages":{}})",
         R"({"max_tokens":1,"messages":[{"content":"x"}]})",
         R"({"max_tokens":1,"messages":[{"role":"system","content":"x"}]})",
         R"({"max_tokens":1,"messages":[{"role":"user"}]})",
         R"({"max_tokens":1,"messages":[{"role":"user","content":5}]})",
         R"({"max_tokens":1,"messages":[{"role":"user","content":["x"]}]})",
         R"({"max_tokens":1,"messages":[{"role":"user","content":[{"text":"x"}]}]})",
         R"({"max_tokens":1,"messages":[{"role":"user","content":[{"type":"text"}]}]})",
         R"({"max_tokens":1,"system":5,"messages":[{"role":"user","content":"x"}]})",
         R"({"max_tokens":1,"system":[{"type":"image"}],"messages":[{"role":"user","content":"x"}]})",
         R"({"max_tokens":1,"temperature":1.5,"messages":[{"role":"user","content":"x"}]})",
         R"({"max_tokens":1,"top_p":"1","messages":[{"role":"user","content":"x"}]})",
         R"({"max_tokens":1,"stop_sequences":"x","messages":[{"role":"user","content":"x"}]})",
         R"({"max_tokens":1,"stop_sequences":[3],"messages":[{"role":"user","content":"x"}]})",
         R"({"max_tokens":1,"stream":"yes","messages":[{"role":"user","content":"x"}]})",
         R"({"max_tokens":1,"metadata":"m","messages":[{"role":"user","content":"x"}]})"})
        EXPECT_NE(error_of(b), "") << b;
}

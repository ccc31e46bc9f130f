#include <gtest/gtest.h>

#include <string>

#include "server/api_error.h"
#include "server/request.h"

using ds4::server::ApiError;
using ds4::server::parse_chat_request;
using ds4::server::parse_completion_request;
using ds4::tokenizer::ThinkMode;

namespace {

int status_of(const std::string &body, bool chat = true) {
    try {
        chat ? parse_chat_request(body) : parse_completion_request(body);
        return 200;
    } catch (const ApiError &e) {
        return e.status;
    }
}

}  // namespace

TEST(Request, ChatFields) {
    const auto r = parse_chat_request(R"({"model":"m","messages":[
        {"role":"system","content":"S"},
        {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},"b"]},
        {"content":"implicit user"}],
        "max_completion_tokens":7,"temperature":0,"top_p":0.5,"top_k":3,"min_p":0,"seed":42,
        "stop":["x",""],"stream":true,"stream_options":{"include_usage":true}})");
    ASSERT_EQ(r.messages.size(), 3u);
    EXPECT_EQ(r.messages[1].content, "ab");
    EXPECT_EQ(r.messages[2].role, "user");
    EXPECT_EQ(r.max_tokens, 7);
    EXPECT_EQ(r.sampling.temperature, 0.0f);
    EXPECT_EQ(r.sampling.top_k, 3);
    EXPECT_EQ(r.sampling.seed, 42u);
    EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
    EXPECT_TRUE(r.stream && r.include_usage);
    EXPECT_EQ(r.think, ThinkMode::kNone);
}

TEST(Request, ThinkingControls) {
    const std::string m = R"("messages":[{"role":"user","content":"x"}])";
    EXPECT_EQ(parse_chat_request("{" + m + R"(,"think":true})").think, ThinkMode::kHigh);
    EXPECT_EQ(parse_chat_request("{" + m + R"(,"thinking":{"type":"enabled"}})").think,
              ThinkMode::kHigh);
    EXPECT_EQ(parse_chat_request("{" + m + R"(,"reasoning_effort":"max"})").think, ThinkMode::kMax);
    EXPECT_EQ(parse_chat_request("{" + m + R"(,"model":"deepseek-reasoner"})").think,
              ThinkMode::kHigh);
    EXPECT_EQ(
        parse_chat_request("{" + m + R"(,"model":"deepseek-reasoner","thinking":false})").think,
        ThinkMode::kNone);
}

TEST(Request, ClampsAndNulls) {
    const std::string m = R"("messages":[{"role":"user","content":"x"}])";
    EXPECT_EQ(parse_chat_request("{" + m + R"(,"max_tokens":-5})").max_tokens, 0);
    EXPECT_EQ(parse_chat_request("{" + m + R"(,"max_tokens":99999999999999999999})").max_tokens,
              2147483647);
    EXPECT_FALSE(parse_chat_request("{" + m + R"(,"max_tokens":null})").max_tokens.has_value());
    EXPECT_EQ(parse_chat_request("{" + m + R"(,"seed":-3})").sampling.seed, 0u);
}

TEST(Request, BadBodiesAre400) {
    for (const char *b : {"", "{", "[]", "null", R"({"messages":[]})", R"({"messages":{}})",
                          R"({"messages":[{"role":"x"}]})", R"({"messages":[{"content":1}]})",
                          R"({"messages":[{"content":"a"}],"temperature":"1"})",
                          R"({"messages":[{"content":"a"}],"temperature":1e999})",
                          R"({"messages":[{"content":"a"}],"top_k":1.5})",
                          R"({"messages":[{"content":"a"}],"stop":[null]})",
                          R"({"messages":[{"content":"a"}],"stream":0})",
                          R"({"messages":[{"content":"a"}],"reasoning_effort":"x"})",
                          R"({"messages":[{"content":"a","tool_calls":[{}]}]})"})
        EXPECT_EQ(status_of(b), 400) << b;
    EXPECT_EQ(status_of(std::string(300, '[') + std::string(300, ']')), 400);
    EXPECT_EQ(status_of(R"({"prompt":"x"})", false), 200);
    EXPECT_EQ(status_of(R"({"prompt":["x"]})", false), 200);
    EXPECT_EQ(status_of(R"({"prompt":["x","y"]})", false), 400);
    EXPECT_EQ(status_of(R"({"prompt":1})", false), 400);
    EXPECT_EQ(status_of(R"({})", false), 400);
}

TEST(Request, NestingCheckIgnoresBracketsInStrings) {
    const std::string deep = "\"" + std::string(1000, '[') + "\"";
    EXPECT_EQ(status_of(R"({"messages":[{"content":)" + deep + "}]}"), 200);
}

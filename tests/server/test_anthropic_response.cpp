#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/anthropic_response.h"

using ds4::server::AnthropicStream;
using ds4::server::Delta;
using ds4::server::GenResult;
using ds4::server::SseEvent;
using nlohmann::json;

namespace {

GenResult result(ds4::runtime::StopReason stop, const std::string &content = "",
                 const std::string &reasoning = "") {
    GenResult g;
    g.content = content;
    g.reasoning = reasoning;
    g.stop = stop;
    g.prompt_tokens = 10;
    g.cached_tokens = 4;
    g.completion_tokens = 3;
    return g;
}

// "name" or "name/delta type" per event, with every data.type checked against the name.
std::vector<std::string> names(const std::vector<SseEvent> &events) {
    std::vector<std::string> out;
    for (const SseEvent &e : events) {
        EXPECT_EQ(e.data.at("type"), e.name);
        out.push_back(e.name == "content_block_delta"
                          ? e.name + "/" + e.data["delta"]["type"].get<std::string>()
                          : e.name);
    }
    return out;
}

void append(std::vector<SseEvent> &all, std::vector<SseEvent> more) {
    all.insert(all.end(), more.begin(), more.end());
}

}  // namespace

TEST(AnthropicResponse, StopReasons) {
    using ds4::runtime::StopReason;
    EXPECT_STREQ(anthropic_stop_reason(result(StopReason::Eos)), "end_turn");
    EXPECT_STREQ(anthropic_stop_reason(result(StopReason::Interrupted)), "end_turn");
    EXPECT_STREQ(anthropic_stop_reason(result(StopReason::Length)), "max_tokens");
    EXPECT_STREQ(anthropic_stop_reason(result(StopReason::ContextFull)),
                 "model_context_window_exceeded");
    GenResult g = result(StopReason::Interrupted);
    g.stop_sequence = true;
    g.matched_stop = "##";
    EXPECT_STREQ(anthropic_stop_reason(g), "stop_sequence");
    EXPECT_EQ(anthropic_message(g, "msg_1", "m")["stop_sequence"], "##");
}

TEST(AnthropicResponse, StopReasonOfAnAnswerWithCalls) {
    using ds4::runtime::StopReason;
    GenResult g = result(StopReason::Interrupted);
    g.tool_calls = {{.id = "", .name = "f", .arguments = R"({"a":"x"})"}};
    g.finish_reason = "tool_calls";
    EXPECT_STREQ(anthropic_stop_reason(g), "tool_use");
    // A call the token limit cut (the engine's finish "length"): the answer hit max_tokens, and
    // the call is still shown as far as it was written.
    g.stop = StopReason::Length;
    g.finish_reason = "length";
    g.tool_call_cut = true;
    EXPECT_STREQ(anthropic_stop_reason(g), "max_tokens");
    const json m = anthropic_message(g, "msg_1", "m");
    EXPECT_EQ(m["stop_reason"], "max_tokens");
    ASSERT_EQ(m["content"].size(), 1u);
    EXPECT_EQ(m["content"][0]["input"], json({{"a", "x"}}));
}

TEST(AnthropicResponse, MessageAndUsage) {
    const json m =
        anthropic_message(result(ds4::runtime::StopReason::Eos, "Ciao", "hmm"), "msg_7", "mod");
    EXPECT_EQ(m["id"], "msg_7");
    EXPECT_EQ(m["type"], "message");
    EXPECT_EQ(m["role"], "assistant");
    EXPECT_EQ(m["model"], "mod");
    EXPECT_EQ(m["stop_sequence"], nullptr);
    EXPECT_EQ(m["content"],
              json::parse(R"([{"type":"thinking","thinking":"hmm","signature":"msg_7"},
                                            {"type":"text","text":"Ciao"}])"));
    EXPECT_EQ(m["usage"], json::parse(R"({"input_tokens":6,"output_tokens":3,
                                          "cache_read_input_tokens":4,"cache_creation_input_tokens":0})"));
    // No text: still one (empty) text block.
    EXPECT_EQ(anthropic_message(result(ds4::runtime::StopReason::Length), "i", "m")["content"],
              json::parse(R"([{"type":"text","text":""}])"));
}

TEST(AnthropicResponse, ErrorBody) {
    EXPECT_EQ(ds4::server::anthropic_error_body(400, "bad"),
              json::parse(
                  R"({"type":"error","error":{"type":"invalid_request_error","message":"bad"}})"));
    EXPECT_EQ(ds4::server::anthropic_error_body(401, "k")["error"]["type"], "authentication_error");
    EXPECT_EQ(ds4::server::anthropic_error_body(404, "k")["error"]["type"], "not_found_error");
    EXPECT_EQ(ds4::server::anthropic_error_body(413, "k")["error"]["type"], "request_too_large");
    EXPECT_EQ(ds4::server::anthropic_error_body(500, "k")["error"]["type"], "api_error");
    EXPECT_EQ(ds4::server::anthropic_error_body(400, "k", {{"n_ctx", 5}})["error"]["n_ctx"], 5);
}

TEST(AnthropicResponse, StreamOfThinkingThenText) {
    AnthropicStream s("msg_3", "mod");
    const GenResult g = result(ds4::runtime::StopReason::Eos);
    std::vector<SseEvent> all = s.start(g);
    EXPECT_EQ(all[0].data["message"]["usage"]["output_tokens"], 0);
    EXPECT_EQ(all[0].data["message"]["usage"]["input_tokens"], 6);
    EXPECT_EQ(all[0].data["message"]["content"], json::array());
    append(all, s.delta({.content = "", .reasoning = "r1"}));
    append(all, s.delta({.content = "", .reasoning = "r2"}));
    append(all, s.delta({.content = "t1", .reasoning = ""}));
    append(all, s.delta({.content = "t2", .reasoning = ""}));
    append(all, s.finish(g));
    EXPECT_EQ(names(all),
              (std::vector<std::string>{
                  "message_start", "content_block_start", "content_block_delta/thinking_delta",
                  "content_block_delta/thinking_delta", "content_block_delta/signature_delta",
                  "content_block_stop", "content_block_start", "content_block_delta/text_delta",
                  "content_block_delta/text_delta", "content_block_stop", "message_delta",
                  "message_stop"}));
    EXPECT_EQ(all[1].data["index"], 0);
    EXPECT_EQ(all[1].data["content_block"]["type"], "thinking");
    EXPECT_EQ(all[4].data["delta"]["signature"], "msg_3");
    EXPECT_EQ(all[6].data["index"], 1);
    EXPECT_EQ(all[6].data["content_block"], json::parse(R"({"type":"text","text":""})"));
    EXPECT_EQ(all[8].data["delta"]["text"], "t2");
    EXPECT_EQ(all[9].data["index"], 1);
    EXPECT_EQ(all[10].data["delta"]["stop_reason"], "end_turn");
    EXPECT_EQ(all[10].data["usage"]["output_tokens"], 3);
    EXPECT_EQ(all[10].data["usage"]["cache_read_input_tokens"], 4);
}

TEST(AnthropicResponse, StreamWithoutTextHasAnEmptyTextBlock) {
    AnthropicStream s("m", "m");
    const GenResult g = result(ds4::runtime::StopReason::Length);
    std::vector<SseEvent> all = s.start(g);
    append(all, s.finish(g));
    EXPECT_EQ(names(all),
              (std::vector<std::string>{"message_start", "content_block_start",
                                        "content_block_stop", "message_delta", "message_stop"}));
    EXPECT_EQ(all[3].data["delta"]["stop_reason"], "max_tokens");
}

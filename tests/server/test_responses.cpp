// The Responses API's pure parts (docs/SERVER.md, Responses): the request parser, the stored
// responses' bounds and eviction, and the events and objects of ResponsesStream.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/request.h"
#include "server/responses_request.h"
#include "server/responses_response.h"
#include "server/responses_store.h"
#include "server/tool_calls.h"

using namespace ds4::server;  // NOLINT: the unit under test
using ds4::tokenizer::ChatMessage;
using ds4::tokenizer::ThinkMode;
using nlohmann::json;

namespace {

// The param of the 400 a body gets; "" when it parses.
std::string param_of(const std::string &body) {
    try {
        parse_responses_request(body);
        return "";
    } catch (const ApiError &e) {
        EXPECT_EQ(e.status, 400) << body;
        return e.extra.value("param", "?");
    }
}

std::vector<ChatMessage> messages_of(const std::string &body) {
    auto r = parse_responses_request(body);
    with_history(r, {});
    return r.gen.messages;
}

std::vector<std::string> names(const std::vector<SseEvent> &evs) {
    std::vector<std::string> out;
    for (const SseEvent &e : evs) out.push_back(e.name);
    return out;
}

GenResult result(std::string finish) {
    GenResult g;
    g.finish_reason = std::move(finish);
    g.prompt_tokens = 10;
    g.cached_tokens = 4;
    g.completion_tokens = 3;
    return g;
}

}  // namespace

TEST(ResponsesRequest, FieldsAndEcho) {
    const auto r = parse_responses_request(R"({"model":"m","input":"ciao","instructions":"S",
        "max_output_tokens":7,"temperature":0,"top_p":0.5,"stream":true,"store":false,
        "metadata":{"k":"v"},"previous_response_id":"resp_1","reasoning":{"effort":"high"}})");
    EXPECT_EQ(r.gen.max_tokens, 7);
    EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
    EXPECT_EQ(r.gen.sampling.top_p, 0.5f);
    EXPECT_TRUE(r.gen.stream);
    EXPECT_FALSE(r.store);
    EXPECT_EQ(r.previous_response_id, "resp_1");
    EXPECT_EQ(r.gen.think, ThinkMode::kHigh);
    EXPECT_EQ(r.echo["instructions"], "S");
    EXPECT_EQ(r.echo["max_output_tokens"], 7);
    EXPECT_EQ(r.echo["metadata"], json({{"k", "v"}}));
    EXPECT_EQ(r.echo["reasoning"]["effort"], "high");
    EXPECT_EQ(r.echo["store"], false);
    EXPECT_EQ(r.echo["tool_choice"], "auto");
    const auto d = parse_responses_request(R"({"input":"x"})");
    EXPECT_TRUE(d.store);
    EXPECT_EQ(d.gen.think, ThinkMode::kNone);
    EXPECT_EQ(d.echo["previous_response_id"], nullptr);
    EXPECT_EQ(d.echo["max_output_tokens"], nullptr);
    EXPECT_EQ(parse_responses_request(R"({"input":"x","reasoning":{"effort":"none"}})").gen.think,
              ThinkMode::kNone);
}

TEST(ResponsesRequest, InputItemsAreTheChatMessages) {
    // The same conversation as chat messages renders the same: the chat parser is the oracle.
    const auto m = messages_of(R"({"instructions":"S","input":[
        {"role":"developer","content":"D"},
        {"type":"message","role":"user","content":[{"type":"input_text","text":"a"},
                                                    {"type":"input_text","text":"b"}]},
        {"type":"reasoning","id":"rs_1","summary":[],
         "content":[{"type":"reasoning_text","text":"R"}]},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"T"}]},
        {"type":"function_call","call_id":"call_1","name":"f","arguments":"{\"x\":1}"},
        {"type":"function_call_output","call_id":"call_1","output":"out"},
        {"role":"user","content":"q"}]})");
    const auto c = parse_chat_request(R"({"messages":[{"role":"system","content":"S"},
        {"role":"developer","content":"D"},{"role":"user","content":"ab"},
        {"role":"assistant","content":"T","reasoning_content":"R","tool_calls":[
          {"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"out"},{"role":"user","content":"q"}]})");
    ASSERT_EQ(m.size(), c.messages.size());
    for (size_t i = 0; i < m.size(); ++i) {
        EXPECT_EQ(m[i].role, c.messages[i].role) << i;
        EXPECT_EQ(m[i].content, c.messages[i].content) << i;
        EXPECT_EQ(m[i].reasoning, c.messages[i].reasoning) << i;
        ASSERT_EQ(m[i].tool_calls.size(), c.messages[i].tool_calls.size()) << i;
        for (size_t k = 0; k < m[i].tool_calls.size(); ++k) {
            EXPECT_EQ(m[i].tool_calls[k].id, c.messages[i].tool_calls[k].id);
            EXPECT_EQ(m[i].tool_calls[k].name, c.messages[i].tool_calls[k].name);
            EXPECT_EQ(m[i].tool_calls[k].arguments, c.messages[i].tool_calls[k].arguments);
        }
    }
    // A call with no message before it opens an assistant message of its own.
    const auto f = messages_of(R"({"input":[{"role":"user","content":"q"},
        {"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]})");
    ASSERT_EQ(f.size(), 2u);
    EXPECT_EQ(f[1].role, "assistant");
    EXPECT_EQ(f[1].content, "");
    ASSERT_EQ(f[1].tool_calls.size(), 1u);
}

TEST(ResponsesRequest, ToolsRenderAsTheChatFunction) {
    const auto r = parse_responses_request(R"({"input":"x","tools":[{"type":"function",
        "name":"get_weather","description":"D","parameters":{"type":"object"},"strict":true}],
        "tool_choice":{"type":"function","name":"get_weather"}})");
    const auto c = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],
        "tools":[{"type":"function","function":{"name":"get_weather","description":"D",
        "parameters":{"type":"object"},"strict":true}}],
        "tool_choice":{"type":"function","function":{"name":"get_weather"}}})");
    EXPECT_EQ(r.gen.tool_schemas, c.tool_schemas);
    EXPECT_EQ(r.gen.tool_prefix, c.tool_prefix);
    EXPECT_FALSE(r.gen.tool_prefix.empty());
    const auto none = parse_responses_request(
        R"({"input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":"none"})");
    EXPECT_TRUE(none.gen.tool_schemas.empty());
}

TEST(ResponsesRequest, BadBodiesName400Params) {
    EXPECT_EQ(param_of(R"({"input":"x"})"), "");
    EXPECT_EQ(param_of(R"({})"), "input");
    EXPECT_EQ(param_of(R"({"input":[]})"), "input");
    EXPECT_EQ(param_of(R"({"input":3})"), "input");
    EXPECT_EQ(param_of(R"({"input":[{"role":"tool","content":"x"}]})"), "input");
    EXPECT_EQ(param_of(R"({"input":[{"role":"user","content":[{"type":"input_image",
        "image_url":"u"}]}]})"),
              "input");
    EXPECT_EQ(param_of(R"({"input":[{"type":"web_search_call","id":"w"}]})"), "input");
    EXPECT_EQ(param_of(R"({"input":[{"type":"function_call","name":"f"}]})"), "input");
    EXPECT_EQ(param_of(R"({"input":[{"content":"no type nor role"}]})"), "input");
    EXPECT_EQ(param_of(R"({"input":"x","temperature":3})"), "temperature");
    EXPECT_EQ(param_of(R"({"input":"x","max_output_tokens":"9"})"), "max_output_tokens");
    EXPECT_EQ(param_of(R"({"input":"x","store":"yes"})"), "store");
    EXPECT_EQ(param_of(R"({"input":"x","previous_response_id":5})"), "previous_response_id");
    EXPECT_EQ(param_of(R"({"input":"x","metadata":[]})"), "metadata");
    EXPECT_EQ(param_of(R"({"input":"x","reasoning":{"effort":"huge"}})"), "reasoning.effort");
    EXPECT_EQ(param_of(R"({"input":"x","conversation":"conv_1"})"), "conversation");
    EXPECT_EQ(param_of(R"({"input":"x","tools":[{"type":"web_search"}]})"), "tools");
    EXPECT_EQ(param_of(R"({"input":"x","tool_choice":"required"})"), "tool_choice");
    EXPECT_EQ(param_of(R"({"input":"x","tools":[{"type":"function","name":"f"}],
        "tool_choice":{"type":"function","name":"g"}})"),
              "tool_choice");
    EXPECT_EQ(param_of("[1]"), "?");
}

// A one-message turn with no history, for the store's tests.
std::shared_ptr<ResponseTurn> turn(std::string text) {
    return std::make_shared<ResponseTurn>(
        nullptr, std::vector<ChatMessage>{{.role = "user", .content = std::move(text)}});
}

TEST(ResponsesStore, KeepsTheLastNAndEvictsTheOldest) {
    ResponsesStore s(2);
    s.put("a", {json{{"id", "a"}}, turn("1")});
    s.put("b", {json{{"id", "b"}}, turn("2")});
    EXPECT_EQ(s.size(), 2u);
    s.get("a");  // reading does not refresh: the oldest stored goes first
    s.put("c", {json{{"id", "c"}}, turn("3")});
    EXPECT_EQ(s.size(), 2u);
    EXPECT_FALSE(s.get("a"));
    ASSERT_TRUE(s.get("b") && s.get("c"));
    EXPECT_EQ(s.get("c")->response["id"], "c");
    s.put("c", {json{{"id", "c2"}}, turn("4")});  // replaced, not counted twice
    EXPECT_EQ(s.size(), 2u);
    EXPECT_EQ(s.get("c")->response["id"], "c2");
    EXPECT_TRUE(s.get("b"));
    ResponsesStore none(0);
    none.put("a", {json::object(), turn("1")});
    EXPECT_EQ(none.size(), 0u);
    EXPECT_FALSE(none.get("a"));
}

TEST(ResponsesStore, EraseRemovesOneAndFreesItsPlace) {
    ResponsesStore s(2);
    s.put("a", {json{{"id", "a"}}, turn("1")});
    s.put("b", {json{{"id", "b"}}, turn("2")});
    EXPECT_TRUE(s.erase("a"));
    EXPECT_FALSE(s.erase("a"));
    EXPECT_FALSE(s.erase("never"));
    EXPECT_FALSE(s.get("a"));
    EXPECT_EQ(s.size(), 1u);
    // The erased entry's place is free: one more put evicts nothing, the next evicts b (oldest).
    s.put("c", {json{{"id", "c"}}, turn("3")});
    ASSERT_TRUE(s.get("b") && s.get("c"));
    s.put("d", {json{{"id", "d"}}, turn("4")});
    EXPECT_FALSE(s.get("b"));
    EXPECT_TRUE(s.get("c") && s.get("d"));
    EXPECT_EQ(s.size(), 2u);
}

TEST(ResponsesStore, ConversationFollowsTheChainAndOutlivesEviction) {
    ResponsesStore s(1);
    auto first = std::make_shared<ResponseTurn>(
        nullptr, std::vector<ChatMessage>{{.role = "user", .content = "q1"},
                                          {.role = "assistant", .content = "a1"}});
    s.put("r1", {json::object(), first});
    s.put("r2", {json::object(),
                 std::make_shared<ResponseTurn>(
                     first, std::vector<ChatMessage>{{.role = "user", .content = "q2"},
                                                     {.role = "assistant", .content = "a2"}})});
    first.reset();
    EXPECT_FALSE(s.get("r1"));  // evicted, but r2's conversation still holds its turn
    const auto conv = conversation(s.get("r2")->turn.get());
    ASSERT_EQ(conv.size(), 4u);
    EXPECT_EQ(conv[0].content, "q1");
    EXPECT_EQ(conv[3].content, "a2");
    EXPECT_TRUE(conversation(nullptr).empty());
    // A long chain is released without recursing once per turn.
    std::shared_ptr<const ResponseTurn> chain;
    for (int i = 0; i < 200000; ++i)
        chain = std::make_shared<ResponseTurn>(chain, std::vector<ChatMessage>{});
    chain.reset();
}

TEST(ResponsesStream, TextEventsInOrderWithSequenceNumbers) {
    ResponsesStream s(ResponseMeta{"resp_x", 5, "m", json{{"store", true}}});
    std::vector<SseEvent> all = s.start();
    for (const char *piece : {"Quel", " ramo"}) {
        auto evs = s.delta({.content = piece, .reasoning = "", .tools = {}});
        all.insert(all.end(), evs.begin(), evs.end());
    }
    GenResult g = result("length");
    auto end = s.finish(g);
    all.insert(all.end(), end.begin(), end.end());
    EXPECT_EQ(names(all),
              (std::vector<std::string>{"response.created", "response.in_progress",
                                        "response.output_item.added", "response.content_part.added",
                                        "response.output_text.delta", "response.output_text.delta",
                                        "response.output_text.done", "response.content_part.done",
                                        "response.output_item.done", "response.incomplete"}));
    for (size_t i = 0; i < all.size(); ++i) {
        EXPECT_EQ(all[i].data["sequence_number"], i);
        EXPECT_EQ(all[i].data["type"], all[i].name);
    }
    EXPECT_EQ(all[0].data["response"]["status"], "in_progress");
    EXPECT_EQ(all[0].data["response"]["output"], json::array());
    EXPECT_EQ(all[0].data["response"]["store"], true);
    const std::string item_id = all[2].data["item"]["id"];
    EXPECT_TRUE(item_id.starts_with("msg_") && item_id.size() == 36);
    EXPECT_EQ(all[4].data["item_id"], item_id);
    EXPECT_EQ(all[6].data["text"], "Quel ramo");
    const json &r = all.back().data["response"];
    EXPECT_EQ(r, s.response());
    EXPECT_EQ(r["status"], "incomplete");
    EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
    EXPECT_EQ(r["output"][0]["status"], "incomplete");
    EXPECT_EQ(r["output"][0]["content"][0]["text"], "Quel ramo");
    EXPECT_EQ(r["usage"]["input_tokens"], 10);
    EXPECT_EQ(r["usage"]["input_tokens_details"]["cached_tokens"], 4);
    EXPECT_EQ(r["usage"]["output_tokens"], 3);
    EXPECT_EQ(r["usage"]["total_tokens"], 13);
}

TEST(ResponsesStream, ReasoningThenTextThenACall) {
    ResponsesStream s(ResponseMeta{"resp_x", 5, "m", json::object()});
    s.start();
    std::vector<SseEvent> all;
    auto add = [&](const Delta &d) {
        auto evs = s.delta(d);
        all.insert(all.end(), evs.begin(), evs.end());
    };
    add({.content = "", .reasoning = "think", .tools = {}});
    add({.content = "Vediamo.", .reasoning = "", .tools = {}});
    using K = ToolEvent::Kind;
    add({.content = "",
         .reasoning = "",
         .tools = {{K::Start, 0, "get_weather"},
                   {K::Arguments, 0, "{\"city\":\"Prague\""},
                   {K::Arguments, 0, "}"},
                   {K::End, 0, ""}}});
    GenResult g = result("tool_calls");
    g.reasoning_tokens = 2;
    auto end = s.finish(g);
    all.insert(all.end(), end.begin(), end.end());
    EXPECT_EQ(
        names(all),
        (std::vector<std::string>{
            "response.output_item.added", "response.content_part.added",
            "response.reasoning_text.delta", "response.reasoning_text.done",
            "response.content_part.done", "response.output_item.done", "response.output_item.added",
            "response.content_part.added", "response.output_text.delta",
            "response.output_text.done", "response.content_part.done", "response.output_item.done",
            "response.output_item.added", "response.function_call_arguments.delta",
            "response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.output_item.done", "response.completed"}));
    EXPECT_EQ(all[12].data["output_index"], 2);
    EXPECT_EQ(all[12].data["item"]["arguments"], "");
    EXPECT_EQ(all[12].data["item"]["name"], "get_weather");
    EXPECT_EQ(all[15].data["arguments"], "{\"city\":\"Prague\"}");
    const json &out = s.response()["output"];
    ASSERT_EQ(out.size(), 3u);
    EXPECT_EQ(out[0]["type"], "reasoning");
    EXPECT_EQ(out[0]["content"][0], json({{"type", "reasoning_text"}, {"text", "think"}}));
    EXPECT_EQ(out[1]["type"], "message");
    EXPECT_EQ(out[1]["status"], "completed");
    EXPECT_EQ(out[2]["type"], "function_call");
    EXPECT_EQ(out[2]["status"], "completed");
    EXPECT_EQ(out[2]["arguments"], "{\"city\":\"Prague\"}");
    const std::string call_id = out[2]["call_id"], fc_id = out[2]["id"];
    EXPECT_TRUE(call_id.starts_with("call_") && call_id.size() == 37);
    EXPECT_TRUE(fc_id.starts_with("fc_"));
    EXPECT_EQ(s.response()["status"], "completed");
    EXPECT_EQ(s.response()["incomplete_details"], nullptr);
    EXPECT_EQ(s.response()["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
    // The output read back as input items is the assistant turn the store keeps.
    const auto turn = read_input_items(out, "output");
    ASSERT_EQ(turn.size(), 1u);
    EXPECT_EQ(turn[0].role, "assistant");
    EXPECT_EQ(turn[0].content, "Vediamo.");
    EXPECT_EQ(turn[0].reasoning, "think");
    ASSERT_EQ(turn[0].tool_calls.size(), 1u);
    EXPECT_EQ(turn[0].tool_calls[0].id, call_id);
    EXPECT_EQ(turn[0].tool_calls[0].arguments, "{\"city\":\"Prague\"}");
}

TEST(ResponsesStream, NonStreamedIsTheReplayedResult) {
    GenResult g = result("tool_calls");
    g.content = "";
    g.tool_calls = {{.id = "", .name = "f", .arguments = "{\"a\":1}"}};
    const json r = response_from_result(ResponseMeta{"resp_y", 7, "m", {}}, g);
    EXPECT_EQ(r["id"], "resp_y");
    EXPECT_EQ(r["object"], "response");
    EXPECT_EQ(r["created_at"], 7);
    EXPECT_EQ(r["status"], "completed");
    ASSERT_EQ(r["output"].size(), 1u);  // no message when a call came and no text
    EXPECT_EQ(r["output"][0]["type"], "function_call");
    EXPECT_EQ(r["output"][0]["name"], "f");
    EXPECT_EQ(r["output"][0]["arguments"], "{\"a\":1}");
    // Nothing at all: one empty message.
    const json e = response_from_result(ResponseMeta{"resp_z", 7, "m", {}}, result("stop"));
    ASSERT_EQ(e["output"].size(), 1u);
    EXPECT_EQ(e["output"][0]["type"], "message");
    EXPECT_EQ(e["output"][0]["content"][0]["text"], "");
    EXPECT_EQ(e["output"][0]["status"], "completed");
}

TEST(ResponsesStream, DsmlFromTheModelBecomesAFunctionCallItem) {
    // The tracker's events for sampled DSML, as the engine hands them on, through the builder.
    ToolCallTracker tracker;
    const std::string dsml =
        "Vediamo.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Prague</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    ResponsesStream s(ResponseMeta{"resp_t", 1, "m", json::object()});
    s.start();
    std::vector<SseEvent> all;
    for (size_t i = 0; i < dsml.size(); i += 7) {  // in pieces, as tokens come
        ToolOutput o = tracker.push(std::string_view(dsml).substr(i, 7));
        auto evs = s.delta({.content = o.content, .reasoning = "", .tools = o.events});
        all.insert(all.end(), evs.begin(), evs.end());
    }
    ASSERT_TRUE(tracker.done());
    GenResult g = result("tool_calls");
    g.tool_calls = tracker.calls();
    auto end = s.finish(g);
    all.insert(all.end(), end.begin(), end.end());
    const json &out = s.response()["output"];
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0]["content"][0]["text"], "Vediamo.");
    EXPECT_EQ(out[1]["type"], "function_call");
    EXPECT_EQ(out[1]["name"], "get_weather");
    EXPECT_EQ(json::parse(out[1]["arguments"].get<std::string>()),
              json({{"city", "Prague"}, {"days", 3}}));
    EXPECT_EQ(all.back().name, "response.completed");
    std::string streamed;
    for (const SseEvent &e : all)
        if (e.name == "response.function_call_arguments.delta") streamed += e.data["delta"];
    EXPECT_EQ(streamed, out[1]["arguments"]);
    // The non-streamed response of the same result has the same items but their ids.
    json r = response_from_result(ResponseMeta{"resp_t", 1, "m", {}}, [&] {
        GenResult h = g;
        h.content = "Vediamo.";
        return h;
    }());
    for (json *o : {&r["output"][0], &r["output"][1]}) o->erase("id");
    r["output"][1].erase("call_id");
    json want = out;
    for (auto &o : want) o.erase("id");
    want[1].erase("call_id");
    EXPECT_EQ(r["output"], want);
}

TEST(ResponsesStream, ACallCutByTheLimitStreamsLiveAndIsIncomplete) {
    // The tracker's events for a call whose string value was still being written when the token
    // limit came (the engine's finish "length"), fed in 5-byte pieces as tokens would come.
    ToolCallTracker tracker;
    const std::string dsml =
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Praga, la città dalle cento torri";
    ResponsesStream s(ResponseMeta{"resp_c", 1, "m", json::object()});
    s.start();
    std::vector<SseEvent> all;
    auto add = [&](ToolOutput o) {
        auto evs = s.delta({.content = o.content, .reasoning = "", .tools = o.events});
        all.insert(all.end(), evs.begin(), evs.end());
    };
    for (size_t i = 0; i < dsml.size(); i += 5)
        add(tracker.push(std::string_view(dsml).substr(i, 5)));
    add(tracker.finish());
    ASSERT_TRUE(tracker.cut());
    GenResult g = result("length");
    g.tool_calls = tracker.calls();
    g.tool_call_cut = true;
    auto end = s.finish(g);
    all.insert(all.end(), end.begin(), end.end());
    const std::string want = R"({"city":"Praga, la città dalle cento torri"})";
    std::string streamed;
    size_t deltas = 0;
    for (const SseEvent &e : all)
        if (e.name == "response.function_call_arguments.delta") {
            streamed += e.data["delta"];
            ++deltas;
        }
    EXPECT_EQ(streamed, want);
    EXPECT_GT(deltas, 5u);  // the value came piece by piece
    const json &r = s.response();
    EXPECT_EQ(r["status"], "incomplete");
    ASSERT_EQ(r["output"].size(), 1u);
    EXPECT_EQ(r["output"][0]["type"], "function_call");
    EXPECT_EQ(r["output"][0]["status"], "incomplete");
    EXPECT_EQ(r["output"][0]["arguments"], want);
    EXPECT_EQ(all.back().name, "response.incomplete");
    // The non-streamed response of the same result says the same.
    const json n = response_from_result(ResponseMeta{"resp_d", 1, "m", {}}, g);
    EXPECT_EQ(n["status"], "incomplete");
    EXPECT_EQ(n["output"][0]["status"], "incomplete");
    EXPECT_EQ(n["output"][0]["arguments"], want);
}

// Tool calls in ds4-server: the streaming DSML tracker (server/tool_calls.h), the tool fields of
// both request parsers and the prompt they render.
//
// Oracles: the DSML strings are written by hand from DeepSeek's encoding_dsv4.py
// (tool_call_template, tool_calls_template, encode_arguments_to_dsml: "\n\n" + block,
// `<｜DSML｜invoke name="N">\n` + one parameter per line + `\n</｜DSML｜invoke>`) and the tools
// block from the reference server's append_tools_prompt_text (ds4_server.c), transcribed below;
// the tokenizer's parser is a cross-check for the arguments, never the expected value.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "server/anthropic_request.h"
#include "server/api_error.h"
#include "server/request.h"
#include "server/tool_calls.h"
#include "tokenizer/chat_render.h"

namespace ds4::server {
namespace {

using nlohmann::json;

// A hand-written call as encoding_dsv4.py renders {"city":"Prague","days":3} for get_weather.
const std::string kWeatherBlock =
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Prague</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

struct Collected {
    std::string content;
    std::vector<ToolEvent> events;
    std::vector<std::string> args;  // per call, the Arguments pieces joined
    std::vector<std::string> names;
};

void collect(Collected &c, ToolOutput out) {
    c.content += out.content;
    for (ToolEvent &e : out.events) {
        if (e.kind == ToolEvent::Kind::Start) {
            EXPECT_EQ(e.index, c.names.size());
            c.names.push_back(e.text);
            c.args.emplace_back();
        } else if (e.kind == ToolEvent::Kind::Arguments) {
            EXPECT_EQ(e.index + 1, c.args.size());
            c.args.back() += e.text;
        }
        c.events.push_back(std::move(e));
    }
}

// Feeds text in pieces of `step` bytes (0: whole), then finishes.
Collected feed(const std::string &text, size_t step = 0, ToolCallTracker *t = nullptr) {
    ToolCallTracker local;
    ToolCallTracker &tr = t ? *t : local;
    Collected c;
    if (step == 0) step = text.size() + 1;
    for (size_t i = 0; i < text.size(); i += step) collect(c, tr.push(text.substr(i, step)));
    collect(c, tr.finish());
    return c;
}

TEST(ToolCallTracker, ParsesTheTemplateBlockIntoOneCall) {
    ToolCallTracker t;
    const Collected c = feed("Let me check." + kWeatherBlock, 0, &t);
    EXPECT_EQ(c.content, "Let me check.");
    ASSERT_EQ(c.names, std::vector<std::string>{"get_weather"});
    EXPECT_EQ(c.args[0], R"({"city":"Prague","days":3})");
    ASSERT_EQ(t.calls().size(), 1u);
    EXPECT_EQ(t.calls()[0].arguments, c.args[0]);
    EXPECT_TRUE(t.done());
    // Start, one piece per member and the closing brace, End.
    ASSERT_EQ(c.events.size(), 5u);
    EXPECT_EQ(c.events[1].text, R"({"city":"Prague")");
    EXPECT_EQ(c.events[2].text, R"(,"days":3)");
    EXPECT_EQ(c.events[3].text, "}");
}

TEST(ToolCallTracker, AnySplitGivesTheSameAnswerAndNeverShowsMarkup) {
    const std::string text = "Sì <b> & 3 < 4\n" + kWeatherBlock;
    const Collected whole = feed(text);
    for (size_t step = 1; step < 40; ++step) {
        const Collected c = feed(text, step);
        EXPECT_EQ(c.content, "Sì <b> & 3 < 4") << step;
        EXPECT_EQ(c.args, whole.args) << step;
        EXPECT_EQ(c.names, whole.names) << step;
    }
}

TEST(ToolCallTracker, HoldsAPossibleOpenerAndTheWhitespaceBeforeIt) {
    ToolCallTracker t;
    EXPECT_EQ(t.push("ciao\n\n<｜DS").content, "ciao");
    EXPECT_EQ(t.push("x").content, "\n\n<｜DSx");  // not an opener after all
    EXPECT_EQ(t.push("  ").content, "");
    EXPECT_EQ(t.finish().content, "  ");
}

TEST(ToolCallTracker, TextAfterTheBlockIsNotPartOfTheAnswer) {
    const Collected c = feed("a" + kWeatherBlock + "\nmore text");
    EXPECT_EQ(c.content, "a");
    EXPECT_EQ(c.names.size(), 1u);
}

TEST(ToolCallTracker, SeveralCallsAndOtherSpellings) {
    const Collected c = feed(
        "<tool_calls><invoke name=\"a\"></invoke>\n<invoke name=\"b\"><parameter name=\"x\" "
        "string=\"false\">[1, 2]</parameter></invoke></tool_calls>");
    EXPECT_EQ(c.names, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(c.args, (std::vector<std::string>{"{}", R"({"x":[1,2]})"}));
    const Collected s =
        feed("<DSML｜tool_calls>\n<DSML｜invoke name=\"f\">\n</DSML｜invoke>\n</DSML｜tool_calls>");
    EXPECT_EQ(s.names, std::vector<std::string>{"f"});
}

TEST(ToolCallTracker, AnInvokeCloseTagInsideAStringValueDoesNotEndTheCall) {
    const std::string value = "x </｜DSML｜invoke> y &amp; z";
    const Collected c = feed(
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"w\">\n<｜DSML｜parameter name=\"s\" "
        "string=\"true\">" +
            value + "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        3);
    ASSERT_EQ(c.args.size(), 1u) << c.content;
    EXPECT_EQ(json::parse(c.args[0])["s"], value);
    EXPECT_EQ(c.content, "");
}

TEST(ToolCallTracker, ValuesThatAreNotJsonBecomeStrings) {
    // The documented choice for a string="false" body that is not JSON: the raw text as a
    // string, so the arguments stay a valid JSON object.
    const Collected c = feed(
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" "
        "string=\"false\">{\"a\": 1,</｜DSML｜parameter>\n<｜DSML｜parameter name=\"e\" "
        "string=\"false\"></｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
    ASSERT_EQ(c.args.size(), 1u);
    EXPECT_EQ(c.args[0], R"({"n":"{\"a\": 1,","e":null})");
}

TEST(ToolCallTracker, AMalformedBlockWithoutCallsIsReturnedAsText) {
    const std::string block = "\n\n<｜DSML｜tool_calls>\nstray text\n</｜DSML｜tool_calls>";
    ToolCallTracker t;
    const Collected c = feed("ok" + block + " after", 5, &t);
    EXPECT_EQ(c.content, "ok" + block + " after");
    EXPECT_TRUE(c.events.empty());
    EXPECT_FALSE(t.done());
}

TEST(ToolCallTracker, ADefectAfterACompleteCallKeepsTheCallAndEndsTheAnswer) {
    ToolCallTracker t;
    const std::string head = kWeatherBlock.substr(0, kWeatherBlock.find("</｜DSML｜tool_calls>"));
    const Collected c = feed(head + "garbage <｜DSML｜invoke", 4, &t);
    EXPECT_EQ(c.content, "");
    EXPECT_EQ(c.names.size(), 1u);
    EXPECT_TRUE(t.done());
}

TEST(ToolCallTracker, AnUnfinishedBlockIsTextUnlessACallCompleted) {
    const std::string cut = kWeatherBlock.substr(0, kWeatherBlock.find("</｜DSML｜invoke>"));
    EXPECT_EQ(feed("a" + cut).content, "a" + cut);
    EXPECT_TRUE(feed("a" + cut).events.empty());
    // EOS right after the invoke: the call stands.
    const std::string no_close =
        kWeatherBlock.substr(0, kWeatherBlock.find("</｜DSML｜tool_calls>"));
    const Collected c = feed(no_close);
    EXPECT_EQ(c.names.size(), 1u);
    EXPECT_EQ(c.content, "");
}

TEST(ToolCallTracker, InvalidUtf8InAValueIsNotACallAndDoesNotThrow) {
    const std::string block =
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"s\" "
        "string=\"true\">\xff\xfe</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    Collected c;
    EXPECT_NO_THROW(c = feed(block));
    EXPECT_TRUE(c.events.empty());
    EXPECT_EQ(c.content, block);
}

TEST(ToolCallTracker, SilentTextMovesTheStateButIsNotShown) {
    ToolCallTracker t;
    Collected c;
    collect(c, t.push_silent("prefilled " + kWeatherBlock));
    EXPECT_EQ(c.content, "");
    EXPECT_EQ(c.names.size(), 1u);
    EXPECT_TRUE(t.done());

    // A forced named call: the model writes the parameters and the closing tags.
    ToolCallTracker f;
    Collected d;
    collect(d, f.push_silent(forced_tool_prefix(ToolChoice::Named, "get_weather")));
    EXPECT_TRUE(d.events.empty());
    collect(d, f.push(kWeatherBlock.substr(kWeatherBlock.find("<｜DSML｜parameter"))));
    EXPECT_EQ(d.args, std::vector<std::string>{R"({"city":"Prague","days":3})"});
    // Broken after the silent prefix: only the generated text comes back.
    ToolCallTracker b;
    collect(d, b.push_silent(forced_tool_prefix(ToolChoice::Required, "")));
    EXPECT_EQ(b.push("Quel ramo").content, "Quel ramo");
}

TEST(ToolCallTracker, RandomBytesAndTagSoupNeverThrowAndSplitsAgree) {
    const std::vector<std::string> atoms = {"<｜DSML｜tool_calls>",
                                            "</｜DSML｜tool_calls>",
                                            "<｜DSML｜invoke",
                                            "</｜DSML｜invoke>",
                                            "<｜DSML｜parameter",
                                            "</｜DSML｜parameter>",
                                            " name=\"f\"",
                                            " string=\"false\"",
                                            " string=\"true\"",
                                            ">",
                                            "\n",
                                            "<",
                                            "{\"a\":1}",
                                            "&lt;",
                                            "\xff",
                                            "<tool_calls>",
                                            "<invoke",
                                            "</invoke>",
                                            "<DSML｜tool_calls>",
                                            "x",
                                            " ",
                                            "\"",
                                            "｜"};
    std::mt19937 rng(1234);
    for (int iter = 0; iter < 3000; ++iter) {
        std::string text;
        const int n = int(rng() % 40);
        for (int i = 0; i < n; ++i) {
            if (rng() % 5 == 0)
                text += char(rng() % 256);
            else
                text += atoms[rng() % atoms.size()];
        }
        Collected whole, split;
        ASSERT_NO_THROW(whole = feed(text)) << iter;
        ASSERT_NO_THROW(split = feed(text, 1 + rng() % 7)) << iter;
        EXPECT_EQ(whole.content, split.content) << iter;
        EXPECT_EQ(whole.args, split.args) << iter;
        for (const std::string &a : whole.args) EXPECT_TRUE(json::accept(a)) << a;
    }
}

TEST(ToolChoicePrefix, IsTheStartOfTheTemplateBlock) {
    EXPECT_EQ(forced_tool_prefix(ToolChoice::Auto, ""), "");
    EXPECT_EQ(forced_tool_prefix(ToolChoice::Required, ""), "\n\n<｜DSML｜tool_calls>\n");
    EXPECT_EQ(forced_tool_prefix(ToolChoice::Named, "a\"b"),
              "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a&quot;b\">\n");
}

TEST(ToolIds, HavePrefixAnd32HexDigits) {
    const std::string a = make_tool_id("call_"), b = make_tool_id("call_");
    EXPECT_EQ(a.size(), 37u);
    EXPECT_TRUE(a.starts_with("call_"));
    EXPECT_EQ(a.find_first_not_of("0123456789abcdef", 5), std::string::npos);
    EXPECT_NE(a, b);
}

// ------------------------------------------------------------------------- requests, render

// The reference server's tools block (ds4_server.c, append_tools_prompt_text), transcribed.
std::string ds4_tools_block(const std::string &schemas) {
    return "## Tools\n\nYou have access to a set of tools to help answer the user question. You "
           "can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
           "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n<｜DSML｜parameter "
           "name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
           "...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n"
           "</｜DSML｜tool_calls>\n\nString parameters should be specified as raw text and set "
           "`string=\"true\"`. Preserve characters such as `>`, `&`, and `&&` exactly; never "
           "replace normal string characters with XML or HTML entity escapes. Only if a string "
           "value itself contains the exact closing parameter tag `</｜DSML｜parameter>`, write "
           "that tag as `&lt;/｜DSML｜parameter>` inside the value. For all other types (numbers, "
           "booleans, arrays, objects), pass the value in JSON format and set "
           "`string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST "
           "output your complete reasoning inside <think>...</think> BEFORE any tool calls or "
           "final response.\n\nOtherwise, output directly after </think> with tool calls or "
           "final response.\n\n### Available Tool Schemas\n\n" +
           schemas +
           "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to "
           "invoke tool calls. Use the exact parameter names from the schemas.";
}

std::string rendered(const GenRequest &r) {
    return tokenizer::render_chat_prompt(r.messages, r.tool_schemas, r.think) +
           r.assistant_prefill + r.tool_prefix;
}

// One weather round trip: the tool, the call (arguments in a key order that is not sorted), the
// result, in the OpenAI shape.
const char *kOpenAiRoundTrip = R"({"messages":[
  {"role":"system","content":"Be brief."},
  {"role":"user","content":"Weather in Prague?"},
  {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
    "function":{"name":"get_weather","arguments":"{\"city\": \"Prague\", \"days\": 3}"}}]},
  {"role":"tool","tool_call_id":"call_1","content":"{\"temp\": 21}"}],
 "tools":[{"type":"function","function":{"name":"get_weather","description":"Forecast",
   "parameters":{"type":"object","properties":{"days":{"type":"integer"},"city":{"type":"string"}}}}}]})";

const std::string kSchema =
    R"({"name":"get_weather","description":"Forecast","parameters":{"type":"object","properties":{"days":{"type":"integer"},"city":{"type":"string"}}}})";

// The expected prompt: BOS, tools block then system text (docs/SURFACES.md 3.6), the user turn,
// the assistant turn with encoding_dsv4.py's DSML and EOS, the result as <tool_result>.
const std::string kRoundTripPrompt =
    "<｜begin▁of▁sentence｜>" + ds4_tools_block(kSchema) +
    "\n\nBe brief.<｜User｜>Weather in Prague?<｜Assistant｜></think>" + kWeatherBlock +
    "<｜end▁of▁sentence｜><｜User｜><tool_result>{\"temp\": 21}</tool_result><｜Assistant｜>"
    "</think>";

TEST(ToolRequests, OpenAiRoundTripRendersAsTheTemplate) {
    const GenRequest r = parse_chat_request(kOpenAiRoundTrip);
    EXPECT_EQ(rendered(r), kRoundTripPrompt);
    ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
    EXPECT_EQ(r.messages[2].tool_calls[0].id, "call_1");
}

TEST(ToolRequests, AnthropicRoundTripRendersTheSamePrompt) {
    const GenRequest r = parse_messages_request(R"({"max_tokens":5,"system":"Be brief.",
      "tools":[{"name":"get_weather","description":"Forecast","input_schema":{"type":"object",
        "properties":{"days":{"type":"integer"},"city":{"type":"string"}}},
        "cache_control":{"type":"ephemeral"}}],
      "messages":[{"role":"user","content":"Weather in Prague?"},
        {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather",
          "input":{"city":"Prague","days":3}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1",
          "content":[{"type":"text","text":"{\"temp\": 21}"}]}]}]})");
    std::string want = kRoundTripPrompt;
    const std::string schema_a =
        R"({"name":"get_weather","description":"Forecast","input_schema":{"type":"object","properties":{"days":{"type":"integer"},"city":{"type":"string"}}}})";
    want.replace(want.find(kSchema), kSchema.size(), schema_a);
    EXPECT_EQ(rendered(r), want);
}

TEST(ToolRequests, ToolResultBlocksJoinAndEscape) {
    const GenRequest r = parse_messages_request(R"({"max_tokens":5,"messages":[
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","is_error":true,
        "content":[{"type":"text","text":"a</tool_result>"},{"type":"text","text":"b"}]},
        {"type":"text","text":"go on"}]}]})");
    EXPECT_EQ(r.messages[0].content, "<tool_result>a&lt;/tool_result>\n\nb</tool_result>go on");
}

TEST(ToolRequests, ToolChoiceForcesTheCallOrDropsTheTools) {
    const std::string tools = R"("tools":[{"type":"function","function":{"name":"f"}}])";
    const std::string user = R"("messages":[{"role":"user","content":"x"}])";
    auto chat = [&](const std::string &extra) {
        return parse_chat_request("{" + user + "," + tools + extra + "}");
    };
    EXPECT_TRUE(chat(R"(,"tool_choice":"none")").tool_schemas.empty());
    EXPECT_EQ(chat(R"(,"tool_choice":"auto")").tool_prefix, "");
    EXPECT_EQ(chat(R"(,"tool_choice":"required")").tool_prefix, "\n\n<｜DSML｜tool_calls>\n");
    EXPECT_EQ(chat(R"(,"tool_choice":{"type":"function","function":{"name":"f"}})").tool_prefix,
              "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n");
    for (const char *bad : {R"(,"tool_choice":"sometimes")",
                            R"(,"tool_choice":{"type":"function","function":{"name":"g"}})",
                            R"(,"tool_choice":"required","think":true)", R"(,"tool_choice":3)"})
        EXPECT_THROW(chat(bad), ApiError) << bad;
    EXPECT_THROW(parse_chat_request("{" + user + R"(,"tool_choice":"required"})"), ApiError);

    const std::string a = R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],
        "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":)";
    EXPECT_EQ(parse_messages_request(a + R"({"type":"any"}})").tool_prefix,
              "\n\n<｜DSML｜tool_calls>\n");
    EXPECT_EQ(parse_messages_request(a + R"({"type":"tool","name":"f"}})").tool_prefix,
              "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n");
    EXPECT_TRUE(parse_messages_request(a + R"({"type":"none"}})").tool_schemas.empty());
    EXPECT_THROW(parse_messages_request(a + R"({"type":"tool","name":"zz"}})"), ApiError);
    EXPECT_THROW(parse_messages_request(a + R"("any"})"), ApiError);
}

TEST(ToolRequests, MalformedToolFieldsAre400) {
    const char *bad_chat[] = {
        R"({"messages":[{"role":"user","content":"x"}],"tools":{}})",
        R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"code_interpreter"}]})",
        R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":""}}]})",
        R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]})",
        R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"function":{}}]}]})",
        R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":{}}]})",
        R"({"messages":[{"role":"user","content":"x","tool_calls":[{"function":{"name":"f"}}]}]})",
        R"({"messages":[{"role":"tool","tool_call_id":5,"content":"x"}]})",
        R"({"messages":[{"role":"assistant","content":"x","prefix":true}]})",
    };
    for (const char *b : bad_chat) EXPECT_THROW(parse_chat_request(b), ApiError) << b;
    const char *bad_messages[] = {
        R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305","name":"w"}]})",
        R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"input_schema":{}}]})",
        R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]})",
        R"({"max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"a"}]}]})",
        R"({"max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":[]}]}]})",
        R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"image"}]}]}]})",
        R"({"max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]})",
    };
    for (const char *b : bad_messages) EXPECT_THROW(parse_messages_request(b), ApiError) << b;
}

TEST(ToolRequests, ObjectArgumentsKeepTheirKeyOrderAndPrefixIsAPrefill) {
    const GenRequest r = parse_chat_request(R"({"messages":[{"role":"user","content":"x"},
      {"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"z":1,"a":[2]}}}]},
      {"role":"tool","content":"ok"},
      {"role":"assistant","content":"So","prefix":true}]})");
    EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"z":1,"a":[2]})");
    EXPECT_EQ(r.assistant_prefill, "So");
    EXPECT_EQ(r.messages.size(), 3u);
}

}  // namespace
}  // namespace ds4::server

// Chat rendering and DSML tool calls.
//
// Oracles: the official API's usage.prompt_tokens for the five official vectors (rendered with
// -sys "" and no-think); strings produced by DeepSeek's reference encoder (encoding_dsv4.py) for
// the cases where the reference engine renders the same thing; the token ids docs/MODEL.md section
// 6 quotes from DeepSeek's own V4 tokenizer tests; and, for DSML, render-then-parse round trips.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_prompt.h"
#include "tokenizer/chat_render.h"
#include "tokenizer/dsml_parser.h"
#include "tokenizer/dsml_render.h"
#include "tokenizer_fixtures.h"

namespace ds4::tokenizer {
namespace {

using testing::v4_tokenizer;

const char *const kVectorIds[] = {"short_italian_fact", "short_code_completion",
                                  "short_reasoning_plain", "long_code_audit",
                                  "long_memory_archive"};

TEST(ChatPrompt, OfficialVectorsHaveTheApiPromptTokenCount) {
    const Tokenizer &tok = v4_tokenizer();
    for (const char *id : kVectorIds) {
        const std::string dir = testing::source_path("tests/test-vectors/");
        const auto official =
            nlohmann::json::parse(testing::read_bytes(dir + "official/" + id + ".official.json"));
        const std::string prompt = testing::read_bytes(dir + "prompts/" + id + ".txt");
        const auto ids = encode_cli_prompt(tok, prompt, "", ThinkMode::kNone);
        EXPECT_EQ(ids.size(), official["usage"]["prompt_tokens"].get<size_t>()) << id;
    }
}

TEST(ChatPrompt, CliLayoutIsBosUserTextAssistantThinkTag) {
    const Tokenizer &tok = v4_tokenizer();
    const ChatSpecialIds &s = tok.specials();
    const auto text = tok.encode("Ciao");
    std::vector<int32_t> expected{s.bos, s.user};
    expected.insert(expected.end(), text.begin(), text.end());
    expected.insert(expected.end(), {s.assistant, s.think_close});
    EXPECT_EQ(encode_cli_prompt(tok, "Ciao", "", ThinkMode::kNone), expected);

    // A system text is encoded on its own right after BOS; thinking opens with <think>.
    auto with_system = encode_cli_prompt(tok, "Ciao", kDefaultSystemText, ThinkMode::kHigh);
    const auto system = tok.encode(kDefaultSystemText);
    ASSERT_EQ(with_system.size(), expected.size() + system.size());
    EXPECT_TRUE(std::equal(system.begin(), system.end(), with_system.begin() + 1));
    EXPECT_EQ(with_system.back(), s.think_open);
}

TEST(ChatPrompt, InteractiveTurnsExtendTheOneShotPrompt) {
    const Tokenizer &tok = v4_tokenizer();
    auto transcript = encode_cli_preamble(tok, "sys", ThinkMode::kNone);
    append_cli_user_turn(tok, "first", ThinkMode::kNone, transcript);
    EXPECT_EQ(transcript, encode_cli_prompt(tok, "first", "sys", ThinkMode::kNone));
    transcript.push_back(tok.specials().eos);  // after the generated reply
    const size_t before = transcript.size();
    append_cli_user_turn(tok, "second", ThinkMode::kHigh, transcript);
    EXPECT_EQ(transcript[before], tok.specials().user);
    EXPECT_EQ(transcript.back(), tok.specials().think_open);
}

TEST(ChatPrompt, ThinkMaxPrefixIsTheReferenceText) {
    // encoding_dsv4.py renders this exact text after BOS for reasoning_effort "high", which is
    // the instruction the reference engine uses for Think Max.
    EXPECT_EQ(think_max_prefix(),
              "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very "
              "thorough in your thinking and comprehensively decompose the problem to resolve the "
              "root cause, rigorously stress-testing your logic against all potential paths, edge "
              "cases, and adversarial scenarios.\nExplicitly write out your entire deliberation "
              "process, documenting every intermediate step, considered alternative, and rejected "
              "hypothesis to ensure absolutely no assumption is left unchecked.\n\n");
    EXPECT_EQ(effective_think_mode(ThinkMode::kMax, 393215), ThinkMode::kHigh);
    EXPECT_EQ(effective_think_mode(ThinkMode::kMax, 393216), ThinkMode::kMax);
    const Tokenizer &tok = v4_tokenizer();
    const auto ids = encode_cli_prompt(tok, "x", "", ThinkMode::kMax);
    const auto prefix = tok.encode(think_max_prefix());
    EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), ids.begin() + 1));
}

TEST(ChatPrompt, PreRenderedTranscriptIsTokenizedAsWritten) {
    // The ids DeepSeek's V4 tokenizer tests assert for this text (docs/MODEL.md section 6), with
    // BOS.
    const std::string text =
        "<｜begin▁of▁sentence｜><｜User｜>你好<｜Assistant｜><think>推理</"
        "think>答案<｜end▁of▁sentence｜>";
    EXPECT_EQ(encode_cli_prompt(v4_tokenizer(), text, "ignored system", ThinkMode::kMax),
              (std::vector<int32_t>{0, 128803, 30594, 128804, 128821, 36101, 128822, 7624, 1}));
}

ChatMessage msg(std::string role, std::string content, std::string reasoning = "") {
    ChatMessage m;
    m.role = std::move(role);
    m.content = std::move(content);
    m.reasoning = std::move(reasoning);
    return m;
}

TEST(ChatRender, MatchesTheReferenceEncoderWithoutTools) {
    // Golden strings of encoding_dsv4.py for the same conversations.
    const std::vector<ChatMessage> one{msg("user", "What is 2+2?")};
    EXPECT_EQ(render_chat_prompt(one, {}, ThinkMode::kHigh),
              "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜><think>");
    EXPECT_EQ(render_chat_prompt(one, {}, ThinkMode::kNone),
              "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜></think>");
    const std::vector<ChatMessage> sys{msg("system", "You are a helpful assistant."),
                                       msg("user", "What is 2+2?")};
    EXPECT_EQ(render_chat_prompt(sys, {}, ThinkMode::kHigh),
              "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>What is 2+2?"
              "<｜Assistant｜><think>");
    // Multi-turn: the reasoning of the earlier turn is dropped.
    const std::vector<ChatMessage> turns{
        msg("system", "You are a helpful assistant."), msg("user", "What is 2+2?"),
        msg("assistant", "4", "2 plus 2 is 4."), msg("user", "And 3+3?")};
    EXPECT_EQ(
        render_chat_prompt(turns, {}, ThinkMode::kHigh),
        "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>What is 2+2?"
        "<｜Assistant｜></think>4<｜end▁of▁sentence｜><｜User｜>And 3+3?<｜Assistant｜><think>");
}

TEST(ChatRender, ToolHistoryKeepsReasoningAndRendersCanonicalDsml) {
    // The assistant/tool part of encoding_dsv4.py's "tool_roundtrip" golden; the reference
    // engine writes the same DSML and tool result (its tools prompt text differs, see below).
    ChatMessage call = msg("assistant", "", "I need the weather.");
    call.tool_calls.push_back({"call_1", "get_weather", R"({"city": "Prague", "days": 3})"});
    const std::vector<ChatMessage> history{msg("user", "What is 2+2?"), call,
                                           msg("tool", R"({"temp": 21})")};
    EXPECT_EQ(render_chat_prompt(history, {}, ThinkMode::kHigh),
              "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜><think>I need the "
              "weather.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
              "<｜DSML｜parameter name=\"city\" string=\"true\">Prague</｜DSML｜parameter>\n"
              "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
              "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>"
              "{\"temp\": 21}</tool_result><｜Assistant｜><think>");
}

TEST(ChatRender, ToolsPromptComesBeforeTheSystemText) {
    const std::vector<std::string> schemas{R"({"name":"a"})", R"({"name":"b"})"};
    const std::vector<ChatMessage> m{msg("system", "Be brief."), msg("user", "hi")};
    const std::string out = render_chat_prompt(m, schemas, ThinkMode::kNone);
    const std::string tools = render_tools_prompt(schemas);
    EXPECT_EQ(out,
              std::string(kBosText) + tools + "\n\nBe brief.<｜User｜>hi<｜Assistant｜></think>");
    EXPECT_TRUE(
        tools.starts_with("## Tools\n\nYou have access to a set of tools to help answer "
                          "the user question."));
    EXPECT_NE(tools.find("### Available Tool Schemas\n\n{\"name\":\"a\"}\n{\"name\":\"b\"}\n\n"
                         "You MUST strictly follow"),
              std::string::npos);
    EXPECT_TRUE(tools.ends_with("Use the exact parameter names from the schemas."));
}

TEST(ChatRender, ConsecutiveToolResultsShareOneUserMarkerAndAreEscaped) {
    const std::vector<ChatMessage> m{msg("user", "go"), msg("tool", "a</tool_result>b"),
                                     msg("tool", "c")};
    EXPECT_EQ(render_chat_prompt(m, {}, ThinkMode::kNone),
              "<｜begin▁of▁sentence｜><｜User｜>go<｜User｜><tool_result>a&lt;/tool_result>b"
              "</tool_result><tool_result>c</tool_result><｜Assistant｜></think>");
}

TEST(ChatRender, ToolSchemaLineUnwrapsOpenAiTools) {
    const auto openai = nlohmann::ordered_json::parse(
        R"({"type":"function","function":{"name":"f","parameters":{"type":"object"}}})");
    EXPECT_EQ(tool_schema_line(openai), R"({"name":"f","parameters":{"type":"object"}})");
    const auto anthropic = nlohmann::ordered_json::parse(R"({"name":"g","input_schema":{}})");
    EXPECT_EQ(tool_schema_line(anthropic), R"({"name":"g","input_schema":{}})");
}

TEST(ChatRender, RenderedPromptTokenizesWithSpecials) {
    const Tokenizer &tok = v4_tokenizer();
    ChatMessage call = msg("assistant", "ok");
    call.tool_calls.push_back({"", "f", R"({"x":1})"});
    const std::vector<ChatMessage> m{msg("user", "hi"), call};
    const auto ids = tok.encode_chat_text(render_chat_prompt(m, {}, ThinkMode::kNone));
    const ChatSpecialIds &s = tok.specials();
    EXPECT_EQ(ids.front(), s.bos);
    EXPECT_EQ(ids.back(), s.eos);
    // Each of the six DSML tags of a one-parameter call carries the ｜DSML｜ special.
    EXPECT_EQ(std::count(ids.begin(), ids.end(), s.dsml), 6);
}

// ------------------------------------------------------------------------------------ DSML

std::vector<ToolCall> round_trip(const std::vector<ToolCall> &calls, ParsedMessage *out = nullptr) {
    const std::string text = "Let me check." + render_tool_calls_dsml(calls);
    ParsedMessage p = parse_generated_message(text, false);
    EXPECT_EQ(p.status, DsmlStatus::kComplete) << p.error;
    EXPECT_EQ(p.content, "Let me check.");
    EXPECT_EQ(p.content + p.raw_dsml, text);
    if (out) *out = p;
    return p.tool_calls;
}

void expect_same_calls(const std::vector<ToolCall> &got, const std::vector<ToolCall> &want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].name, want[i].name);
        EXPECT_EQ(nlohmann::ordered_json::parse(got[i].arguments),
                  nlohmann::ordered_json::parse(want[i].arguments));
    }
}

TEST(Dsml, NestedJsonArgumentsRoundTrip) {
    const std::vector<ToolCall> calls{
        {"", "search",
         R"({"query":"x","filters":{"tags":["a",{"b":[1,2.5,null,true]}],"n":{}},"limit":10})"}};
    expect_same_calls(round_trip(calls), calls);
}

TEST(Dsml, StringsWithMarkupCharactersRoundTrip) {
    const std::vector<ToolCall> calls{
        {"", "write_file",
         R"({"path":"a \"b\" <c> & d.html","content":"<div class=\"x\">a > b && c < d</div>\n\ttab","tag":"</｜DSML｜parameter> inside","json":"{\"k\": \"</｜DSML｜parameter>\"}"})"},
        {"", "name<with>&\"quotes\"", R"({"obj":{"s":"</｜DSML｜parameter>"}})"}};
    ParsedMessage p;
    expect_same_calls(round_trip(calls, &p), calls);
    EXPECT_NE(p.raw_dsml.find("&lt;/｜DSML｜parameter> inside"), std::string::npos);
    EXPECT_NE(p.raw_dsml.find("\\u003c/｜DSML｜parameter>"), std::string::npos);
    EXPECT_NE(p.raw_dsml.find("name=\"name&lt;with&gt;&amp;&quot;quotes&quot;\""),
              std::string::npos);
}

TEST(Dsml, MultipleCallsRoundTripInOrder) {
    const std::vector<ToolCall> calls{
        {"", "a", R"({"x":1})"}, {"", "b", R"({})"}, {"", "c", R"({"y":"z","w":[1]})"}};
    expect_same_calls(round_trip(calls), calls);
}

TEST(Dsml, NonObjectArgumentsBecomeOneStringParameter) {
    const std::vector<ToolCall> calls{{"", "raw", "not json"}};
    const auto got = round_trip(calls);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].arguments, R"({"arguments":"not json"})");
}

TEST(Dsml, ThinkingTextIsSplitAndDsmlInReasoningIsIgnored) {
    const std::string dsml = render_tool_calls_dsml(std::vector<ToolCall>{{"", "f", R"({"a":1})"}});
    const ParsedMessage p = parse_generated_message("plan" + dsml + "</think>Answer", true);
    EXPECT_EQ(p.reasoning, "plan" + dsml);
    EXPECT_EQ(p.content, "Answer");
    EXPECT_EQ(p.status, DsmlStatus::kNoToolCalls);
    const ParsedMessage open = parse_generated_message("still thinking", true);
    EXPECT_EQ(open.reasoning, "still thinking");
    EXPECT_EQ(open.content, "");
}

TEST(Dsml, UnclosedBlockIsReportedAsUnterminated) {
    const ParsedMessage p = parse_generated_message(
        "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
        "string=\"true\">x",
        false);
    EXPECT_EQ(p.status, DsmlStatus::kUnterminated);
    EXPECT_EQ(p.content, "Sure.");
    EXPECT_TRUE(p.tool_calls.empty());
    EXPECT_NE(p.error.find("unterminated"), std::string::npos) << p.error;
}

TEST(Dsml, MalformedBlocksAreReportedAndKeptAsContent) {
    const char *bad[] = {
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",  // no
                                                                                             // name
        "<｜DSML｜tool_calls>\nstray text\n</｜DSML｜tool_calls>",
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter string=\"true\">x"
        "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",  // parameter without name
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\">x\n"
        "</｜DSML｜tool_calls>",                        // parameter and invoke never closed
        "<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>",  // empty block
    };
    for (const char *text : bad) {
        const ParsedMessage p = parse_generated_message(text, false);
        EXPECT_EQ(p.status, DsmlStatus::kMalformed) << text;
        EXPECT_TRUE(p.tool_calls.empty());
        EXPECT_EQ(p.content, text);
        EXPECT_NE(p.error.find("malformed"), std::string::npos);
    }
}

TEST(Dsml, ShortAndPlainSpellingsAndLooseParametersAreAccepted) {
    const ParsedMessage shortp = parse_generated_message(
        "<DSML｜tool_calls>\n<DSML｜invoke name=\"f\">\n<DSML｜parameter name=\"a\" "
        "string=\"false\">[1, 2]</DSML｜parameter>\n</DSML｜invoke>\n</DSML｜tool_calls>",
        false);
    ASSERT_EQ(shortp.status, DsmlStatus::kComplete) << shortp.error;
    EXPECT_EQ(shortp.tool_calls[0].arguments, R"({"a":[1,2]})");

    const ParsedMessage plain = parse_generated_message(
        "<tool_calls><invoke name=\"g\"><parameter name=\"p\">text</parameter>"
        "<parameter name=\"o\"> <parameter name=\"k\" string=\"false\">1</parameter>"
        "<parameter name=\"s\">v</parameter> </parameter><parameter name=\"e\" string=\"false\">"
        "</parameter></invoke></tool_calls>",
        false);
    ASSERT_EQ(plain.status, DsmlStatus::kComplete) << plain.error;
    EXPECT_EQ(plain.tool_calls[0].name, "g");
    EXPECT_EQ(plain.tool_calls[0].arguments, R"({"p":"text","o":{"k":1,"s":"v"},"e":null})");
}

// A string="false" body nested deeper than kMaxParameterDepth stays text (printing it as JSON
// would recurse once a level); at the limit it is JSON. Brackets inside JSON strings do not count.
TEST(Dsml, DeeplyNestedJsonParametersStayText) {
    auto call = [](const std::string &body) {
        return parse_generated_message(
            "<tool_calls><invoke name=\"f\"><parameter name=\"a\" "
            "string=\"false\">" +
                body + "</parameter></invoke></tool_calls>",
            false);
    };
    auto nested = [](size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); };
    const ParsedMessage at = call(nested(kMaxParameterDepth));
    ASSERT_EQ(at.status, DsmlStatus::kComplete) << at.error;
    EXPECT_EQ(at.tool_calls[0].arguments, "{\"a\":" + nested(kMaxParameterDepth) + "}");
    const std::string deep = nested(kMaxParameterDepth + 1);
    const ParsedMessage over = call(deep);
    ASSERT_EQ(over.status, DsmlStatus::kComplete) << over.error;
    EXPECT_EQ(over.tool_calls[0].arguments, "{\"a\":\"" + deep + "\"}");
    const ParsedMessage far = call(nested(200000));  // would overflow a stack if printed
    ASSERT_EQ(far.status, DsmlStatus::kComplete) << far.error;
    const std::string quoted = "[\"" + std::string(300, '[') + "\"]";
    EXPECT_EQ(parameter_json_value(quoted), nlohmann::ordered_json::parse(quoted));
}

TEST(Dsml, RawDsmlReplaysTheSampledBytes) {
    const std::string sampled =
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" "
        "string=\"false\">1.50</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    const ParsedMessage p = parse_generated_message("ok" + sampled, false);
    ASSERT_EQ(p.status, DsmlStatus::kComplete);
    EXPECT_EQ(p.raw_dsml, sampled);
    ChatMessage m = msg("assistant", p.content);
    m.tool_calls = p.tool_calls;
    m.raw_dsml = p.raw_dsml;
    const std::vector<ChatMessage> history{msg("user", "u"), m};
    EXPECT_EQ(render_chat_prompt(history, {}, ThinkMode::kNone),
              "<｜begin▁of▁sentence｜><｜User｜>u<｜Assistant｜></think>ok" + sampled +
                  "<｜end▁of▁sentence｜>");
}

}  // namespace
}  // namespace ds4::tokenizer

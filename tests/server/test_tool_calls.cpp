// Tool calls in ds4-server: the streaming DSML tracker (server/tool_calls.h), the tool fields of
// both request parsers and the prompt they render.
//
// Oracles: the DSML strings are written by hand from DeepSeek's encoding_dsv4.py
// (tool_call_template, tool_calls_template, encode_arguments_to_dsml: "\n\n" + block,
// `<｜DSML｜invoke name="N">\n` + one parameter per line + `\n</｜DSML｜invoke>`) and the tools
// block from the reference server's append_tools_prompt_text (ds4_server.c), transcribed below.
// The live fragments are checked against hand-written expectations (what a client may have seen
// after each prefix of the text), and against random arguments rendered to DSML by the
// tokenizer's renderer (the arguments must come back as their compact JSON); the tokenizer's
// parser is a cross-check for the arguments, never the expected value.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "server/anthropic_request.h"
#include "server/api_error.h"
#include "server/request.h"
#include "server/tool_calls.h"
#include "tokenizer/chat_render.h"
#include "tokenizer/dsml_parser.h"
#include "tokenizer/dsml_render.h"
#include "tokenizer/utf8.h"

namespace ds4::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

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
    std::vector<int> ended;  // per call: 0 open, 1 End complete, 2 End cut
};

// Collects a piece's output and checks the event grammar: per call Start, Arguments pieces (each
// valid UTF-8, so that no piece becomes U+FFFD in an SSE event), one End; calls in order.
void collect(Collected &c, ToolOutput out) {
    c.content += out.content;
    for (ToolEvent &e : out.events) {
        if (e.kind == ToolEvent::Kind::Start) {
            EXPECT_EQ(e.index, c.names.size());
            EXPECT_TRUE(c.ended.empty() || c.ended.back() != 0) << "a call started in another";
            c.names.push_back(e.text);
            c.args.emplace_back();
            c.ended.push_back(0);
        } else {
            EXPECT_EQ(e.index + 1, c.args.size());
            if (c.ended.empty()) continue;
            EXPECT_EQ(c.ended.back(), 0) << "an event after the call's End";
            if (e.kind == ToolEvent::Kind::Arguments) {
                EXPECT_FALSE(e.text.empty());
                EXPECT_TRUE(tokenizer::utf8_is_valid(e.text)) << e.text;
                c.args.back() += e.text;
            } else {
                c.ended.back() = e.complete ? 1 : 2;
            }
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

// Feeds text cut at the given offsets (increasing), then finishes unless `open`.
Collected feed_cuts(const std::string &text, const std::vector<size_t> &cuts,
                    ToolCallTracker *t = nullptr, bool open = false) {
    ToolCallTracker local;
    ToolCallTracker &tr = t ? *t : local;
    Collected c;
    size_t from = 0;
    for (size_t cut : cuts) {
        collect(c, tr.push(text.substr(from, cut - from)));
        from = cut;
    }
    collect(c, tr.push(text.substr(from)));
    if (!open) collect(c, tr.finish());
    return c;
}

// The calls' arguments as the tracker keeps them must be the pieces it sent.
void expect_calls_are_the_pieces(const ToolCallTracker &t, const Collected &c) {
    ASSERT_EQ(t.calls().size(), c.args.size());
    for (size_t i = 0; i < c.args.size(); ++i) {
        EXPECT_EQ(t.calls()[i].arguments, c.args[i]) << i;
        EXPECT_EQ(t.calls()[i].name, c.names[i]) << i;
    }
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
    EXPECT_FALSE(t.cut());
    // Pushed whole: Start, the arguments in one piece (the pieces of one push are joined), End.
    ASSERT_EQ(c.events.size(), 3u);
    EXPECT_EQ(c.events[0].kind, ToolEvent::Kind::Start);
    EXPECT_EQ(c.events[1].text, R"({"city":"Prague","days":3})");
    EXPECT_EQ(c.events[2].kind, ToolEvent::Kind::End);
    EXPECT_TRUE(c.events[2].complete);
}

// What a client has seen of call 0 after the first k bytes of `text` were pushed: nothing
// (nullopt) before its Start, else the arguments so far.
std::optional<std::string> seen_after(const std::string &text, size_t k,
                                      const std::vector<size_t> &cuts = {}) {
    ToolCallTracker t;
    const Collected c = feed_cuts(text.substr(0, k), cuts, &t, /*open=*/true);
    if (c.names.empty()) return std::nullopt;
    return c.args[0];
}

TEST(ToolCallTracker, ArgumentsAreSentAsTheyAreWritten) {
    const std::string text = "Let me check." + kWeatherBlock;
    // Hand-written: after the text up to (and including) `upto`, the client has seen `want`.
    const std::vector<std::pair<std::string, std::optional<std::string>>> checkpoints = {
        {"<｜DSML｜tool_calls>", std::nullopt},
        {"<｜DSML｜invoke name=\"get_weather\"", std::nullopt},
        {"<｜DSML｜invoke name=\"get_weather\">\n", std::nullopt},
        {"<｜DSML｜parameter name=\"city\" string=\"true\"", std::nullopt},
        {"<｜DSML｜parameter name=\"city\" string=\"true\">", R"({"city":")"},
        {"\">P", R"({"city":"P)"},
        {"\">Pra", R"({"city":"Pra)"},
        {"Prague", R"({"city":"Prague)"},
        {"Prague<", R"({"city":"Prague)"},
        {"Prague</｜DSML｜param", R"({"city":"Prague)"},
        {"Prague</｜DSML｜parameter>", R"({"city":"Prague")"},
        {"<｜DSML｜parameter name=\"days\" string=\"false\">", R"({"city":"Prague")"},
        {"\">3", R"({"city":"Prague")"},
        {"3</｜DSML｜parameter>", R"({"city":"Prague","days":3)"},
        {"3</｜DSML｜parameter>\n</｜DSML｜invoke", R"({"city":"Prague","days":3)"},
        {"</｜DSML｜invoke>", R"({"city":"Prague","days":3})"},
    };
    size_t from = 0;
    for (const auto &[upto, want] : checkpoints) {
        const size_t at = text.find(upto, from);
        ASSERT_NE(at, std::string::npos) << upto;
        from = at;
        EXPECT_EQ(seen_after(text, at + upto.size()), want) << upto;
    }
    // Every prefix, in every split into two pieces, shows what the byte-by-byte feed shows, and
    // what is shown only grows.
    std::optional<std::string> last;
    for (size_t k = 0; k <= text.size(); ++k) {
        std::vector<size_t> bytes;
        for (size_t i = 1; i < k; ++i) bytes.push_back(i);
        const std::optional<std::string> seen = seen_after(text, k, bytes);
        for (size_t j = 1; j < k; ++j) ASSERT_EQ(seen_after(text, k, {j}), seen) << k << " " << j;
        EXPECT_EQ(seen_after(text, k), seen) << k;
        if (last) {
            ASSERT_TRUE(seen) << k;
            EXPECT_TRUE(seen->starts_with(*last)) << k;
        }
        last = seen;
    }
    EXPECT_EQ(last, R"({"city":"Prague","days":3})");
}

TEST(ToolCallTracker, EverySplitGivesTheSamePiecesJoined) {
    // Values that test the escaping: quotes, a backslash, control characters, multi-byte
    // characters (split by the pieces), the escaped closing tag, entity text kept raw, a lone
    // `<` and `&` (held until the next byte shows they start no tag), a nested object and a
    // parameter without a string attribute.
    const std::string block =
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"w&amp;r\">\n"
        "<｜DSML｜parameter name=\"s\" string=\"true\">He said \"hi\" \\ \n\t\x01 é 😀 "
        "&lt;/｜DSML｜parameter> a < b & c &amp;</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"loc\">\n<｜DSML｜parameter name=\"city\" "
        "string=\"true\">Rōma</｜DSML｜parameter>\n<｜DSML｜parameter name=\"n\" "
        "string=\"false\">[1, 2.5, \"x\"]</｜DSML｜parameter>\n</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"raw\">  spaced</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"t\" string=\"false\">true</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    const std::string want =
        R"({"s":"He said \"hi\" \\ \n\t\u0001 é 😀 </｜DSML｜parameter> a < b & c &amp;",)"
        R"("loc":{"city":"Rōma","n":[1,2.5,"x"]},"raw":"  spaced","t":true})";
    ASSERT_TRUE(json::accept(want));
    // The tokenizer's parser reads the same block the same way.
    const tokenizer::ParsedMessage p = tokenizer::parse_generated_message(block, false);
    ASSERT_EQ(p.tool_calls.size(), 1u);
    EXPECT_EQ(p.tool_calls[0].arguments, want);
    EXPECT_EQ(p.tool_calls[0].name, "w&r");

    auto check = [&](const Collected &c, const ToolCallTracker &t, const std::string &how) {
        ASSERT_EQ(c.names, std::vector<std::string>{"w&r"}) << how;
        EXPECT_EQ(c.args[0], want) << how;
        EXPECT_EQ(c.ended, std::vector<int>{1}) << how;
        EXPECT_EQ(c.content, "") << how;
        EXPECT_TRUE(t.done()) << how;
        expect_calls_are_the_pieces(t, c);
    };
    for (size_t i = 1; i < block.size(); ++i) {
        for (size_t j = i; j < block.size(); j += 7) {  // two and three pieces
            ToolCallTracker t;
            const std::vector<size_t> cuts = j == i ? std::vector<size_t>{i} : std::vector{i, j};
            check(feed_cuts(block, cuts, &t), t, std::to_string(i) + " " + std::to_string(j));
        }
    }
    std::mt19937 rng(99);
    for (int iter = 0; iter < 300; ++iter) {  // many pieces, as tokens come
        std::vector<size_t> cuts;
        for (size_t at = 1 + rng() % 6; at < block.size(); at += 1 + rng() % 6) cuts.push_back(at);
        ToolCallTracker t;
        check(feed_cuts(block, cuts, &t), t, "random " + std::to_string(iter));
    }
}

TEST(ToolCallTracker, RenderedArgumentsComeBackAsTheirJson) {
    // Random arguments, rendered to DSML by the tokenizer's renderer (encoding_dsv4.py's format),
    // fed in random pieces: each call's pieces join to the compact JSON of its arguments.
    const std::vector<std::string> atoms = {"a",
                                            "Z",
                                            " ",
                                            "\n",
                                            "\t",
                                            "\"",
                                            "\\",
                                            "<",
                                            ">",
                                            "&",
                                            "&lt;",
                                            "&amp;",
                                            "é",
                                            "😀",
                                            "｜",
                                            "\x01",
                                            "</｜DSML｜parameter>",
                                            "</｜DSML｜invoke>",
                                            "</｜DSML｜tool_calls>",
                                            "<｜DSML｜parameter",
                                            "{",
                                            "]"};
    std::mt19937 rng(2024);
    // `head` and then up to 7 atoms.
    auto text = [&](const char *head = "") {
        std::string s(head);
        for (int n = int(rng() % 8); n > 0; --n) s += atoms[rng() % atoms.size()];
        return s;
    };
    std::function<ordered_json(int)> value = [&](int depth) -> ordered_json {
        switch (rng() % (depth > 1 ? 5 : 7)) {
            case 0:
                return int64_t(rng() % 2000) - 1000;
            case 1:
                return rng() % 2 == 0;
            case 2:
                return nullptr;
            case 3:
                return double(rng() % 1000) / 8;
            case 4:
                return text();
            case 5: {
                ordered_json a = ordered_json::array();
                for (int n = int(rng() % 3); n > 0; --n) a.push_back(value(depth + 1));
                return a;
            }
            default: {
                ordered_json o = ordered_json::object();
                for (int n = int(rng() % 3); n > 0; --n) o[text()] = value(depth + 1);
                return o;
            }
        }
    };
    for (int iter = 0; iter < 400; ++iter) {
        std::vector<tokenizer::ToolCall> calls;
        for (int n = 1 + int(rng() % 3); n > 0; --n) {
            ordered_json args = ordered_json::object();
            for (int k = int(rng() % 4); k > 0; --k) args[text("k")] = value(0);
            calls.push_back({"", text("f"), args.dump()});
        }
        std::string dsml("ok");
        dsml += tokenizer::render_tool_calls_dsml(calls);
        std::vector<size_t> cuts;
        for (size_t at = 1 + rng() % 9; at < dsml.size(); at += 1 + rng() % 9) cuts.push_back(at);
        ToolCallTracker t;
        const Collected c = feed_cuts(dsml, cuts, &t);
        ASSERT_EQ(c.names.size(), calls.size()) << dsml;
        for (size_t i = 0; i < calls.size(); ++i) {
            EXPECT_EQ(c.names[i], calls[i].name) << dsml;
            EXPECT_EQ(c.args[i], calls[i].arguments) << dsml;
        }
        EXPECT_EQ(c.content, "ok");
        EXPECT_FALSE(t.cut());
        expect_calls_are_the_pieces(t, c);
    }
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
    EXPECT_EQ(c.ended, std::vector<int>{1});
    EXPECT_TRUE(t.done());
    EXPECT_FALSE(t.cut());
}

TEST(ToolCallTracker, AnUnfinishedBlockIsTextUntilACallStarts) {
    // Cut before the first parameter's tag is complete: no call started, the text comes back.
    const std::string before = kWeatherBlock.substr(0, kWeatherBlock.find(" string=\"true\">"));
    EXPECT_EQ(feed("a" + before).content, "a" + before);
    EXPECT_TRUE(feed("a" + before).events.empty());
    // Cut before the invoke's closing tag: the call started and stands, closed where it was cut.
    const std::string cut = kWeatherBlock.substr(0, kWeatherBlock.find("</｜DSML｜invoke>"));
    ToolCallTracker t;
    const Collected c = feed("a" + cut, 0, &t);
    EXPECT_EQ(c.content, "a");
    EXPECT_EQ(c.args, std::vector<std::string>{R"({"city":"Prague","days":3})"});
    EXPECT_EQ(c.ended, std::vector<int>{2});
    EXPECT_TRUE(t.cut());
    // EOS right after the invoke: the call is complete.
    const std::string no_close =
        kWeatherBlock.substr(0, kWeatherBlock.find("</｜DSML｜tool_calls>"));
    ToolCallTracker u;
    const Collected d = feed(no_close, 0, &u);
    EXPECT_EQ(d.names.size(), 1u);
    EXPECT_EQ(d.ended, std::vector<int>{1});
    EXPECT_FALSE(u.cut());
    EXPECT_EQ(d.content, "");
}

// A call whose invoke breaks after its Start: (text, pieces, cut where) -> the arguments it is
// closed with, the same for every split of the text.
TEST(ToolCallTracker, ABrokenCallIsClosedWhereItBroke) {
    const std::string open =
        "Sì.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">";
    const std::string city = open + "Prague</｜DSML｜parameter>\n";
    struct Case {
        std::string text, want;
        bool ends_before_finish;  // the defect is seen without the end of generation
    };
    const std::vector<Case> cases = {
        // the end of generation inside a string value, and with a closing tag half written
        {open + "Pra", R"({"city":"Pra"})", false},
        {open + "Prague</｜DSML｜para", R"({"city":"Prague"})", false},
        {open + "Prague &lt;/｜DSML", R"({"city":"Prague "})", false},
        // inside a JSON value (left out), inside a tag, between parameters
        {city + "<｜DSML｜parameter name=\"days\" string=\"false\">3", R"({"city":"Prague"})",
         false},
        {city + "<｜DSML｜parameter name=\"days\" stri", R"({"city":"Prague"})", false},
        {city, R"({"city":"Prague"})", false},
        // text that is no parameter, a repeated name, a parameter without a name
        {city + "ciao", R"({"city":"Prague"})", true},
        {city + "<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>",
         R"({"city":"Prague"})", true},
        {city + "<｜DSML｜parameter string=\"true\">x</｜DSML｜parameter>", R"({"city":"Prague"})",
         true},
        // invalid UTF-8 in a string value, and in a JSON value
        {open + "Pr\xff", R"({"city":"Pr"})", true},
        {open + "Pr\xe2\x82</｜DSML｜parameter>", R"({"city":"Pr"})", true},
        {city + "<｜DSML｜parameter name=\"d\" string=\"false\">\"\xff\"</｜DSML｜parameter>",
         R"({"city":"Prague"})", true},
        // inside a nested object
        {city + "<｜DSML｜parameter name=\"loc\">\n<｜DSML｜parameter name=\"x\" "
                "string=\"true\">Ro",
         R"({"city":"Prague","loc":{"x":"Ro"}})", false},
        {city + "<｜DSML｜parameter name=\"loc\">\n<｜DSML｜parameter name=\"x\" "
                "string=\"true\">Ro</｜DSML｜parameter>\n</｜DSML｜invoke>",
         R"({"city":"Prague","loc":{"x":"Ro"}})", true},
    };
    for (const Case &k : cases) {
        for (size_t step = 1; step <= k.text.size(); ++step) {
            ToolCallTracker t;
            Collected c;
            for (size_t i = 0; i < k.text.size(); i += step)
                collect(c, t.push(k.text.substr(i, step)));
            EXPECT_EQ(t.done(), k.ends_before_finish) << k.text << " step " << step;
            collect(c, t.finish());
            EXPECT_EQ(c.content, "Sì.") << k.text;
            ASSERT_EQ(c.args, std::vector<std::string>{k.want}) << k.text << " step " << step;
            EXPECT_EQ(c.ended, std::vector<int>{2}) << k.text;
            EXPECT_TRUE(t.cut() && t.done()) << k.text;
            EXPECT_TRUE(json::parse(c.args[0]).is_object());
            expect_calls_are_the_pieces(t, c);
        }
    }
}

TEST(ToolCallTracker, ASecondCallBrokenAfterACompleteOne) {
    const std::string invoke2 =
        "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"q\" "
        "string=\"true\">half";
    const std::string head = kWeatherBlock.substr(0, kWeatherBlock.find("</｜DSML｜tool_calls>"));
    ToolCallTracker t;
    const Collected c = feed(head + invoke2, 3, &t);
    EXPECT_EQ(c.names, (std::vector<std::string>{"get_weather", "f"}));
    EXPECT_EQ(c.args,
              (std::vector<std::string>{R"({"city":"Prague","days":3})", R"({"q":"half"})"}));
    EXPECT_EQ(c.ended, (std::vector<int>{1, 2}));
    EXPECT_TRUE(t.cut());
    // A second invoke that breaks before its Start is dropped; the first call stands whole.
    ToolCallTracker u;
    const Collected d = feed(head + "<｜DSML｜invoke name=\"f\">\noops", 3, &u);
    EXPECT_EQ(d.names, std::vector<std::string>{"get_weather"});
    EXPECT_EQ(d.ended, std::vector<int>{1});
    EXPECT_FALSE(u.cut());
    EXPECT_EQ(d.content, "");
}

TEST(ToolCallTracker, InvalidUtf8InAValueCutsTheCallAndDoesNotThrow) {
    const std::string block =
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"s\" "
        "string=\"true\">\xff\xfe</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    Collected c;
    ToolCallTracker t;
    EXPECT_NO_THROW(c = feed(block, 0, &t));
    EXPECT_EQ(c.args, std::vector<std::string>{R"({"s":""})"});
    EXPECT_TRUE(t.cut());
    EXPECT_EQ(c.content, "");
}

TEST(ToolCallTracker, AStringValueKeepsItsValidUtf8AndBreaksAtTheFirstInvalidByte) {
    // Random byte strings as a string value, in random pieces: the value sent is the longest
    // prefix of whole characters by the tokenizer's strict UTF-8 reading (utf8.h); the call is
    // complete when that is all of it, else cut there.
    const std::vector<std::string> pieces = {"a",
                                             "é",
                                             "€",
                                             "😀",
                                             "\xc3",
                                             "\xe2\x82",
                                             "\xf0\x9f",
                                             "\x80",
                                             "\xc0\x80",
                                             "\xe0\x80\x80",
                                             "\xed\xa0\x80",
                                             "\xf4\x90\x80\x80",
                                             "\xf5",
                                             "\xff",
                                             "\xed\x9f\xbf",
                                             "\xf4\x8f\xbf\xbf"};
    const std::string head =
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"s\" "
        "string=\"true\">";
    const std::string tail = "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    std::mt19937 rng(7);
    for (int iter = 0; iter < 2000; ++iter) {
        std::string v;
        for (int n = 1 + int(rng() % 6); n > 0; --n) v += pieces[rng() % pieces.size()];
        size_t valid = 0;
        char32_t cp = 0;
        for (size_t n; valid < v.size() && (n = tokenizer::utf8_decode(v.substr(valid), &cp)) > 0;)
            valid += n;
        const std::string text = head + v + tail;
        std::vector<size_t> cuts;
        for (size_t at = 1 + rng() % 5; at < text.size(); at += 1 + rng() % 5) cuts.push_back(at);
        ToolCallTracker t;
        const Collected c = feed_cuts(text, cuts, &t);
        ASSERT_EQ(c.args.size(), 1u) << iter;
        EXPECT_EQ(c.args[0], json({{"s", v.substr(0, valid)}}).dump()) << iter;
        EXPECT_EQ(t.cut(), valid < v.size()) << iter;
    }
}

TEST(ToolCallTracker, SilentTextMovesTheStateButIsNotShown) {
    ToolCallTracker t;
    Collected c;
    collect(c, t.push_silent("prefilled " + kWeatherBlock));
    EXPECT_EQ(c.content, "");
    EXPECT_EQ(c.names.size(), 1u);
    EXPECT_TRUE(t.done());

    // A forced named call: the model writes the parameters and the closing tags. The call starts
    // with the first parameter's tag, not with the forced prefix.
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
    ToolCallTracker n;
    collect(d, n.push_silent(forced_tool_prefix(ToolChoice::Named, "get_weather")));
    EXPECT_EQ(n.push("Quel ramo").content, "Quel ramo");
    // A prefill that opens a string value: its part of the value is sent, then what is generated.
    ToolCallTracker p;
    Collected e;
    const std::string open = kWeatherBlock.substr(0, kWeatherBlock.find("Prague") + 3);
    collect(e, p.push_silent(open));
    EXPECT_EQ(e.args, std::vector<std::string>{R"({"city":"Pra)"});
    collect(e, p.push("gue"));
    EXPECT_EQ(e.args, std::vector<std::string>{R"({"city":"Prague)"});
    EXPECT_EQ(e.content, "");
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
        ToolCallTracker tw, ts;
        ASSERT_NO_THROW(whole = feed(text, 0, &tw)) << iter;
        ASSERT_NO_THROW(split = feed(text, 1 + rng() % 7, &ts)) << iter;
        EXPECT_EQ(whole.content, split.content) << iter;
        EXPECT_EQ(whole.args, split.args) << iter;
        EXPECT_EQ(whole.ended, split.ended) << iter;
        expect_calls_are_the_pieces(tw, whole);
        expect_calls_are_the_pieces(ts, split);
        for (const int e : whole.ended) EXPECT_NE(e, 0) << iter;  // every call ended
        for (const std::string &a : whole.args) {
            ASSERT_TRUE(json::accept(a)) << a;
            EXPECT_TRUE(json::parse(a).is_object()) << a;
        }
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

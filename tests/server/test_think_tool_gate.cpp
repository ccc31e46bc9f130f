// ThinkToolGate (server/think_tool_gate.h): a DSML tool-call block opened inside an unclosed think
// block ends the reasoning there. Every split of the text into pieces must give the same
// reasoning and the same rest; the plain spellings of the opener stay reasoning.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "server/think_tool_gate.h"
#include "server/tool_calls.h"

namespace ds4::server {
namespace {

const std::string kOpen = "<｜DSML｜tool_calls>";
const std::string kBlock =
    kOpen +
    "\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Prague</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

struct Result {
    std::string reasoning, rest;
    bool opened = false;
};

// Feeds `text` in pieces of `step` bytes (splitting UTF-8 sequences too), as a stream would.
Result feed(const std::string &text, size_t step) {
    ThinkToolGate gate;
    Result r;
    for (size_t i = 0; i < text.size() && !r.opened; i += step) {
        ThinkToolGate::Output o = gate.push(std::string_view(text).substr(i, step));
        r.reasoning += o.reasoning;
        if (o.opened) {
            r.opened = true;
            r.rest = o.rest + text.substr(std::min(text.size(), i + step));
        }
    }
    if (!r.opened) r.reasoning += gate.flush();
    return r;
}

TEST(ThinkToolGate, OpenerEndsTheReasoningWhateverTheSplit) {
    const std::string thought = "I should look up the weather. ";
    for (size_t step = 1; step <= thought.size() + kBlock.size(); ++step) {
        const Result r = feed(thought + kBlock + "\ntrailing", step);
        ASSERT_TRUE(r.opened) << "step " << step;
        EXPECT_EQ(r.reasoning, thought) << "step " << step;
        EXPECT_EQ(r.rest, kBlock + "\ntrailing") << "step " << step;
    }
}

TEST(ThinkToolGate, TextWithoutTheOpenerIsAllReasoning) {
    // Proper prefixes of the opener, the plain spellings and a near miss stay reasoning.
    const std::string text =
        "compare <｜DSML｜tool with <tool_calls> and <DSML｜tool_calls> and "
        "<｜DSML｜tool_callz> then <｜DSML｜";
    for (size_t step = 1; step <= text.size(); ++step) {
        const Result r = feed(text, step);
        EXPECT_FALSE(r.opened) << "step " << step;
        EXPECT_EQ(r.reasoning, text) << "step " << step;
    }
}

TEST(ThinkToolGate, TheRestParsesAsACall) {
    // What the gate hands on is what the tracker turns into a call (the engine's path).
    const Result r = feed("thinking " + kBlock, 7);
    ASSERT_TRUE(r.opened);
    ToolCallTracker tracker;
    ToolOutput out = tracker.push(r.rest);
    const ToolOutput end = tracker.finish();
    out.content += end.content;
    EXPECT_EQ(out.content, "");
    ASSERT_EQ(tracker.calls().size(), 1u);
    EXPECT_EQ(tracker.calls()[0].name, "get_weather");
}

}  // namespace
}  // namespace ds4::server

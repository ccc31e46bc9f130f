#pragma once
// Turns sampled assistant text back into reasoning, content and structured tool calls
// (docs/SURFACES.md 3.7).
//
// With thinking, the text before the last </think> (minus an opening <think>) is reasoning and
// only the text after it is searched for tool calls: DSML inside reasoning is never executed.
// Three spellings of the block are accepted: <｜DSML｜tool_calls> (canonical), <DSML｜tool_calls>
// (first bar missing) and plain <tool_calls> with <invoke>/<parameter>. Parameters need a name;
// a missing string attribute means string="true". String bodies are taken verbatim except for
// the one escape the tools prompt defines (`&lt;` + closing parameter tag); string="false"
// bodies are JSON (empty means null; text that is not JSON is kept as a string). A parameter
// without a string attribute whose body is itself a list of parameters becomes a JSON object.
//
// Unlike the reference server, `&amp;`-style entities in string bodies are NOT decoded: the
// tools prompt tells the model to write string values raw, so decoding them would corrupt
// values that really contain entity text (HTML sources, for instance).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tool_call.h"

namespace ds4::tokenizer {

enum class DsmlStatus {
    kNoToolCalls,   // no block: everything is content
    kComplete,      // a block parsed into tool_calls
    kUnterminated,  // a block was opened and never closed (generation stopped inside it)
    kMalformed,     // a closed block that does not parse; the text is returned as content
};

struct ParsedMessage {
    std::string reasoning;
    std::string content;  // text before the block (trailing whitespace dropped) + text after it
    std::vector<ToolCall> tool_calls;  // ids left empty: the API layer assigns them
    // The sampled block from the end of `content` (including the whitespace before the block) to
    // the end of its closing tag, for exact replay in the next prompt.
    std::string raw_dsml;
    DsmlStatus status = DsmlStatus::kNoToolCalls;
    std::string error;  // what is wrong and at which byte of the searched text
};

ParsedMessage parse_generated_message(std::string_view text, bool thinking);

// The deepest nesting of [ and { outside JSON strings, counted as a parser would before it
// rejects anything (the text need not be JSON: a stray closer lowers the count).
size_t json_nesting_depth(std::string_view text);

// A string="false" parameter body as JSON: empty (or blank) is null, JSON nested at most
// kMaxParameterDepth deep is itself, any other text (deeper JSON too: printing it recurses once a
// level) the raw body as a string.
inline constexpr size_t kMaxParameterDepth = 128;
nlohmann::ordered_json parameter_json_value(std::string_view raw);

// An attribute value with the five XML entities (&amp; &lt; &gt; &quot; &apos;) decoded, as the
// parser reads a tag's name="..." attributes.
std::string unescape_attr(std::string_view s);

}  // namespace ds4::tokenizer

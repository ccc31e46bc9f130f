#pragma once
// Text the model reads about tools: the tools system prompt and the canonical DSML of tool
// calls in the history (docs/MODEL.md 7.3, docs/SURFACES.md 3.6).
//
// Canonical DSML of a call whose arguments are a JSON object, one parameter per key in the
// object's own key order:
//
//   \n\n<｜DSML｜tool_calls>\n
//   <｜DSML｜invoke name="NAME">\n
//   <｜DSML｜parameter name="KEY" string="true">RAW STRING</｜DSML｜parameter>\n
//   <｜DSML｜parameter name="KEY" string="false">MINIFIED JSON</｜DSML｜parameter>\n
//   </｜DSML｜invoke>\n
//   </｜DSML｜tool_calls>
//
// Escapes: attribute values `& < > "` as entities; string bodies only an embedded
// `</｜DSML｜parameter>` (its `<` as `&lt;`); JSON bodies the same tag with `<` as `\u003c`.
// Arguments that are not a JSON object become one string parameter named "arguments".
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "tokenizer/tool_call.h"

namespace ds4::tokenizer {

// "## Tools ..." block with one function schema (raw JSON text) per line.
std::string render_tools_prompt(std::span<const std::string> tool_schemas);

// One schema line from an API tool object: OpenAI's {"type":"function","function":{...}} is
// unwrapped to the inner function object, anything else (Anthropic tools) is kept; minified,
// key order preserved.
std::string tool_schema_line(const nlohmann::ordered_json &tool);

// The canonical DSML block for the calls of one assistant message ("" for none).
std::string render_tool_calls_dsml(std::span<const ToolCall> calls);

}  // namespace ds4::tokenizer

#pragma once
// A tool call as the API layers see it, and the DSML markup the model reads and writes for it.
#include <string>
#include <string_view>

namespace ds4::tokenizer {

struct ToolCall {
    std::string id;  // API id (call_..., toolu_...); not part of the DSML text
    std::string name;
    std::string arguments;  // JSON text, normally an object

    bool operator==(const ToolCall &) const = default;
};

// DSML tags (full form; the parser also accepts "<DSML｜...>" and plain "<tool_calls>" forms).
inline constexpr std::string_view kDsmlToolCallsOpen = "<｜DSML｜tool_calls>";
inline constexpr std::string_view kDsmlToolCallsClose = "</｜DSML｜tool_calls>";
inline constexpr std::string_view kDsmlInvokeOpen = "<｜DSML｜invoke";
inline constexpr std::string_view kDsmlInvokeClose = "</｜DSML｜invoke>";
inline constexpr std::string_view kDsmlParameterOpen = "<｜DSML｜parameter";
inline constexpr std::string_view kDsmlParameterClose = "</｜DSML｜parameter>";

}  // namespace ds4::tokenizer

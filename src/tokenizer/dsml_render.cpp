#include "tokenizer/dsml_render.h"

#include <optional>
#include <utility>
#include <vector>

namespace ds4::tokenizer {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kToolsPromptHead =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as raw text and set `string=\"true\"`. Preserve "
    "characters such as `>`, `&`, and `&&` exactly; never replace normal string characters with "
    "XML or HTML entity escapes. Only if a string value itself contains the exact closing "
    "parameter tag `</｜DSML｜parameter>`, write that tag as `&lt;/｜DSML｜parameter>` inside the "
    "value. For all other types (numbers, booleans, arrays, objects), pass the value in JSON "
    "format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
constexpr std::string_view kToolsPromptTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls. Use the exact parameter names from the schemas.";

void append_attr_escaped(std::string &out, std::string_view s) {
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            default:
                out += c;
        }
    }
}

// Copies s, writing the `<` of every embedded closing parameter tag as `lt`.
void append_guarding_close_tag(std::string &out, std::string_view s, std::string_view lt) {
    size_t pos = 0;
    for (size_t hit; (hit = s.find(kDsmlParameterClose, pos)) != std::string_view::npos;) {
        out.append(s, pos, hit - pos);
        out += lt;
        pos = hit + 1;
    }
    out.append(s, pos);
}

bool is_json_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t skip_space(std::string_view s, size_t i) {
    while (i < s.size() && is_json_space(s[i])) ++i;
    return i;
}

// End of the string token starting at the quote s[i] (one past the closing quote).
size_t string_token_end(std::string_view s, size_t i) {
    for (++i; i < s.size(); ++i) {
        if (s[i] == '\\') {
            ++i;
        } else if (s[i] == '"') {
            return i + 1;
        }
    }
    return s.size();
}

// End of the value starting at s[i]; s is known to be valid JSON.
size_t value_end(std::string_view s, size_t i) {
    if (s[i] == '"') return string_token_end(s, i);
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        while (i < s.size()) {
            const char c = s[i];
            if (c == '"') {
                i = string_token_end(s, i);
                continue;
            }
            if (c == '{' || c == '[') ++depth;
            if (c == '}' || c == ']') {
                if (--depth == 0) return i + 1;
            }
            ++i;
        }
        return i;
    }
    while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && !is_json_space(s[i])) ++i;
    return i;
}

// JSON text without whitespace outside strings; number spellings are kept as written.
std::string minify(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
        if (s[i] == '"') {
            const size_t end = string_token_end(s, i);
            out.append(s, i, end - i);
            i = end;
        } else {
            if (!is_json_space(s[i])) out += s[i];
            ++i;
        }
    }
    return out;
}

struct Member {
    std::string key;
    std::string_view raw_value;
};

// Top-level members of a JSON object text, in order (duplicates kept); nothing when the text
// is not a valid JSON object.
std::optional<std::vector<Member>> object_members(std::string_view text) {
    if (!ordered_json::accept(text)) return std::nullopt;
    size_t i = skip_space(text, 0);
    if (i >= text.size() || text[i] != '{') return std::nullopt;
    std::vector<Member> members;
    i = skip_space(text, i + 1);
    while (i < text.size() && text[i] != '}') {
        const size_t key_end = string_token_end(text, i);
        Member m;
        m.key = ordered_json::parse(text.substr(i, key_end - i)).get<std::string>();
        i = skip_space(text, key_end) + 1;  // past ':'
        i = skip_space(text, i);
        const size_t end = value_end(text, i);
        m.raw_value = text.substr(i, end - i);
        members.push_back(std::move(m));
        i = skip_space(text, end);
        if (i < text.size() && text[i] == ',') i = skip_space(text, i + 1);
    }
    return members;
}

void append_parameter(std::string &out, std::string_view name, bool is_string,
                      std::string_view body) {
    out += kDsmlParameterOpen;
    out += " name=\"";
    append_attr_escaped(out, name);
    out += is_string ? "\" string=\"true\">" : "\" string=\"false\">";
    append_guarding_close_tag(out, body, is_string ? "&lt;" : "\\u003c");
    out += kDsmlParameterClose;
    out += '\n';
}

}  // namespace

std::string render_tools_prompt(std::span<const std::string> tool_schemas) {
    std::string out(kToolsPromptHead);
    for (size_t i = 0; i < tool_schemas.size(); ++i) {
        if (i > 0) out += '\n';
        out += tool_schemas[i];
    }
    out += kToolsPromptTail;
    return out;
}

std::string tool_schema_line(const ordered_json &tool) {
    if (tool.is_object() && tool.value("type", "") == "function" && tool.contains("function") &&
        tool["function"].is_object()) {
        return tool["function"].dump();
    }
    return tool.dump();
}

std::string render_tool_calls_dsml(std::span<const ToolCall> calls) {
    if (calls.empty()) return "";
    std::string out = "\n\n";
    out += kDsmlToolCallsOpen;
    out += '\n';
    for (const ToolCall &call : calls) {
        out += kDsmlInvokeOpen;
        out += " name=\"";
        append_attr_escaped(out, call.name);
        out += "\">\n";
        if (auto members = object_members(call.arguments)) {
            for (const Member &m : *members) {
                const bool is_string = m.raw_value.front() == '"';
                if (is_string) {
                    append_parameter(out, m.key, true,
                                     ordered_json::parse(m.raw_value).get<std::string>());
                } else {
                    append_parameter(out, m.key, false, minify(m.raw_value));
                }
            }
        } else {
            append_parameter(out, "arguments", true, call.arguments);
        }
        out += kDsmlInvokeClose;
        out += '\n';
    }
    out += kDsmlToolCallsClose;
    return out;
}

}  // namespace ds4::tokenizer

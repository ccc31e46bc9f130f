#include "tokenizer/chat_render.h"

#include "tokenizer/dsml_render.h"
#include "tokenizer/special_tokens.h"

namespace ds4::tokenizer {
namespace {

constexpr std::string_view kToolResultOpen = "<tool_result>";
constexpr std::string_view kToolResultClose = "</tool_result>";

bool is_system(const ChatMessage &m) {
    return m.role == "system" || m.role == "developer";
}
bool is_tool_result(const ChatMessage &m) {
    return m.role == "tool" || m.role == "function";
}
bool is_user_like(const ChatMessage &m) {
    return m.role == "user" || is_tool_result(m);
}

bool has_tool_context(std::span<const ChatMessage> messages, bool has_tools) {
    if (has_tools) return true;
    for (const ChatMessage &m : messages) {
        if (is_tool_result(m) || (m.role == "assistant" && !m.tool_calls.empty())) return true;
    }
    return false;
}

void append_tool_result(std::string &out, std::string_view content) {
    size_t pos = 0;
    for (size_t hit; (hit = content.find(kToolResultClose, pos)) != std::string_view::npos;) {
        out.append(content, pos, hit - pos);
        out += "&lt;";
        pos = hit + 1;
    }
    out.append(content, pos);
}

}  // namespace

std::string render_chat_prompt(std::span<const ChatMessage> messages,
                               std::span<const std::string> tool_schemas, ThinkMode mode) {
    const bool think = thinking_enabled(mode);
    const bool tool_context = has_tool_context(messages, !tool_schemas.empty());

    std::string system;
    if (!tool_schemas.empty()) system = render_tools_prompt(tool_schemas);
    for (const ChatMessage &m : messages) {
        if (!is_system(m)) continue;
        if (!system.empty()) system += "\n\n";
        system += m.content;
    }
    size_t last_user_like = messages.size();  // none
    for (size_t i = 0; i < messages.size(); ++i) {
        if (is_user_like(messages[i])) last_user_like = i;
    }

    std::string out(kBosText);
    if (mode == ThinkMode::kMax) out += think_max_prefix();
    out += system;

    bool assistant_pending = false;  // a user/tool turn waits for an assistant prefix
    bool in_tool_results = false;
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage &m = messages[i];
        if (is_system(m)) continue;
        if (m.role == "user") {
            out += kUserText;
            out += m.content;
            assistant_pending = true;
            in_tool_results = false;
        } else if (is_tool_result(m)) {
            if (!in_tool_results) out += kUserText;
            out += kToolResultOpen;
            append_tool_result(out, m.content);
            out += kToolResultClose;
            assistant_pending = true;
            in_tool_results = true;
        } else if (m.role == "assistant") {
            if (assistant_pending) {
                out += kAssistantText;
                const bool after_last_user =
                    last_user_like == messages.size() || i > last_user_like;
                if (think && (tool_context || after_last_user)) {
                    out += kThinkOpenText;
                    out += m.reasoning;
                }
                out += kThinkCloseText;
            }
            out += m.content;
            if (!m.tool_calls.empty()) {
                out += m.raw_dsml.empty() ? render_tool_calls_dsml(m.tool_calls) : m.raw_dsml;
            }
            out += kEosText;
            assistant_pending = false;
            in_tool_results = false;
        }
    }
    if (assistant_pending) {
        out += kAssistantText;
        out += think ? kThinkOpenText : kThinkCloseText;
    }
    return out;
}

}  // namespace ds4::tokenizer

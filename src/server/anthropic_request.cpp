#include "server/anthropic_request.h"

#include <fmt/format.h>

#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "server/request_fields.h"
#include "tokenizer/dsml_render.h"

namespace ds4::server {

namespace {

using nlohmann::json;
using namespace fields;

// The `type` of a content block, which must be an object with a string type.
std::string block_type(const json &b, const std::string &where, const char *param) {
    if (!b.is_object()) bad(where + " must be a content block (an object)", param);
    const json *t = field(b, "type");
    if (!t || !t->is_string()) bad(where + " needs a string 'type'", param);
    return t->get<std::string>();
}

std::string block_string(const json &b, const char *key, const std::string &where,
                         const char *param) {
    const json *t = field(b, key);
    if (!t || !t->is_string()) bad(fmt::format("{} needs a string '{}'", where, key), param);
    return t->get<std::string>();
}

// `system`: a string, or text blocks joined with newlines. Blocks that start with `x-anthropic-`
// (Claude Code's per-request billing header) are dropped: they change at every request and would
// defeat the prefix reuse.
std::string system_text(const json &s) {
    if (s.is_string()) return s.get<std::string>();
    if (!s.is_array()) bad("'system' must be a string or an array of text blocks", "system");
    std::string out;
    bool first = true;
    for (size_t i = 0; i < s.size(); ++i) {
        const std::string where = fmt::format("system[{}]", i);
        if (block_type(s[i], where, "system") != "text")
            bad(where + " must be a text block", "system");
        const std::string text = block_string(s[i], "text", where, "system");
        if (text.starts_with("x-anthropic-")) continue;
        if (!first) out += '\n';
        out += text;
        first = false;
    }
    return out;
}

// A tool_result block rendered as the template renders a tool result: <tool_result>content
// </tool_result>, an embedded </tool_result> written &lt;/tool_result> (docs/SURFACES.md 3.6).
// content is a string or text blocks, joined with blank lines as encoding_dsv4.py joins them.
// is_error is accepted; the template has no mark for it, so the model reads the content only.
void append_tool_result(const json &b, const std::string &where, std::string &out) {
    block_string(b, "tool_use_id", where, "messages");
    get_bool(b, "is_error");
    std::string text;
    if (const json *c = field(b, "content"); c && c->is_string()) {
        text = c->get<std::string>();
    } else if (c && c->is_array()) {
        for (size_t i = 0; i < c->size(); ++i) {
            const std::string w = fmt::format("{}.content[{}]", where, i);
            if (block_type((*c)[i], w, "messages") != "text")
                bad(w + ": a tool_result holds text blocks only (this server reads text only)",
                    "messages");
            if (i > 0) text += "\n\n";
            text += block_string((*c)[i], "text", w, "messages");
        }
    } else if (c) {
        bad(where + ".content must be a string or an array of text blocks", "messages");
    }
    static constexpr std::string_view kClose = "</tool_result>";
    out += "<tool_result>";
    size_t pos = 0;
    for (size_t hit; (hit = text.find(kClose, pos)) != std::string::npos; pos = hit + 1)
        out.append(text, pos, hit - pos) += "&lt;";
    out.append(text, pos);
    out += kClose;
}

// A tool_use block: {"id", "name", "input": object}, input dumped in the client's key order.
tokenizer::ToolCall tool_use(const json &b, const nlohmann::ordered_json &ordered,
                             const std::string &where) {
    tokenizer::ToolCall call;
    call.id = block_string(b, "id", where, "messages");
    call.name = block_string(b, "name", where, "messages");
    if (call.name.empty()) bad(where + ".name must not be empty", "messages");
    const json *input = field(b, "input");
    if (input && !input->is_object()) bad(where + ".input must be an object", "messages");
    call.arguments = input ? ordered.at("input").dump() : "{}";
    return call;
}

// A message's content: a string, or blocks. Text blocks are concatenated into the content and
// thinking blocks into the reasoning; redacted thinking (another model's encrypted reasoning) is
// skipped; tool_use blocks (assistant) become tool calls and tool_result blocks (user) are
// appended to the content as tool results, in block order, as the reference does; every other
// block type is refused rather than silently dropped. `ordered` gives the message in key order.
void read_content(const json &c, const std::string &where, tokenizer::ChatMessage &m,
                  const std::function<const nlohmann::ordered_json &()> &ordered) {
    if (c.is_string()) {
        m.content = c.get<std::string>();
        return;
    }
    if (!c.is_array())
        bad(where + ".content must be a string or an array of content blocks", "messages");
    for (size_t k = 0; k < c.size(); ++k) {
        const std::string bw = fmt::format("{}.content[{}]", where, k);
        const std::string type = block_type(c[k], bw, "messages");
        if (type == "text") {
            m.content += block_string(c[k], "text", bw, "messages");
        } else if (type == "tool_use" && m.role == "assistant") {
            m.tool_calls.push_back(tool_use(c[k], ordered().at("content").at(k), bw));
        } else if (type == "tool_result" && m.role == "user") {
            append_tool_result(c[k], bw, m.content);
        } else if (type == "tool_use" || type == "tool_result") {
            bad(fmt::format("{}: {} blocks belong in {} messages", bw, type,
                            type == "tool_use" ? "assistant" : "user"),
                "messages");
        } else if (type == "thinking") {
            m.reasoning += block_string(c[k], "thinking", bw, "messages");
        } else if (type == "redacted_thinking") {
            continue;
        } else if (type == "image" || type == "document") {
            bad(fmt::format("{}: {} blocks are not supported: this server reads text only", bw,
                            type),
                "messages");
        } else if (type.ends_with("tool_use") || type.ends_with("tool_result")) {
            bad(fmt::format("{}: {} blocks (server tools) are not supported", bw, type),
                "messages");
        } else {
            bad(fmt::format("{}: content blocks of type '{}' are not supported", bw, type),
                "messages");
        }
    }
}

// Sampling, limit, stop sequences and stream: what a count_tokens body does not need.
void read_generation_fields(const json &j, GenRequest &r) {
    r.max_tokens = get_int(j, "max_tokens", 0, std::numeric_limits<int32_t>::max());
    if (!r.max_tokens) bad("missing max_tokens: the Messages API requires it", "max_tokens");
    if (*r.max_tokens < 1) bad("'max_tokens' must be at least 1", "max_tokens");
    if (auto t = get_number(j, "temperature", 0.0, 1.0)) r.sampling.temperature = float(*t);
    if (auto t = get_number(j, "top_p", 0.0, 1.0)) r.sampling.top_p = float(*t);
    if (auto t = get_int(j, "top_k", 0, std::numeric_limits<int32_t>::max()))
        r.sampling.top_k = int(*t);
    r.stop = get_stops(j, "stop_sequences", /*allow_string=*/false);
    if (auto s = get_bool(j, "stream")) r.stream = *s;
}

// `tools`: client tools {name, description, input_schema}; each becomes one schema line as the
// client wrote it (key order kept), without cache_control and type. Server tools (a type other
// than "custom") are refused. The names are returned.
std::vector<std::string> read_anthropic_tools(const json &j, OrderedBody &ordered, GenRequest &r) {
    return read_tools(j, r, [&](const json &t, const std::string &where, size_t i) {
        if (const auto type = get_string(t, "type"); type && *type != "custom")
            bad(fmt::format("{}: server tools (type '{}') are not supported: only client tools "
                            "with an input_schema",
                            where, *type),
                "tools");
        nlohmann::ordered_json schema = ordered.get().at("tools").at(i);
        schema.erase("cache_control");
        schema.erase("type");
        return ToolDef{&t, "input_schema", tokenizer::tool_schema_line(schema)};
    });
}

// `tool_choice`: {"type": "auto" | "any" | "tool" (with "name") | "none"};
// disable_parallel_tool_use is accepted and ignored.
void read_tool_choice(const json &j, const std::vector<std::string> &names, GenRequest &r) {
    const json *tc = field(j, "tool_choice");
    if (!tc) return;
    if (!tc->is_object()) bad("'tool_choice' must be an object", "tool_choice");
    const auto type = get_string(*tc, "type");
    get_bool(*tc, "disable_parallel_tool_use");
    ToolChoice choice = ToolChoice::Auto;
    std::string name;
    if (type == "none") {
        choice = ToolChoice::None;
    } else if (type == "any") {
        choice = ToolChoice::Required;
    } else if (type == "tool") {
        const auto n = get_string(*tc, "name");
        if (!n) bad("tool_choice of type 'tool' needs a string 'name'", "tool_choice");
        choice = ToolChoice::Named;
        name = *n;
    } else if (type != "auto") {
        bad("'tool_choice.type' must be auto, any, tool or none", "tool_choice");
    }
    apply_tool_choice(r, choice, name, names, "tool_choice");
}

}  // namespace

GenRequest parse_messages_request(std::string_view body, MessagesBody kind) {
    const json j = parse_object(body);
    GenRequest r;
    r.endpoint = Endpoint::Chat;
    if (auto m = get_string(j, "model")) r.model = *m;
    OrderedBody ordered(body);
    const std::vector<std::string> tool_names = read_anthropic_tools(j, ordered, r);
    if (const json *m = field(j, "metadata"); m && !m->is_object())
        bad("'metadata' must be an object", "metadata");
    if (kind == MessagesBody::Create) read_generation_fields(j, r);
    const json *output_config = field(j, "output_config");
    if (output_config && !output_config->is_object())
        bad("'output_config' must be an object", "output_config");
    r.think = get_think(j, r.model, output_config);

    if (const json *s = field(j, "system")) {
        std::string text = system_text(*s);
        if (!text.empty()) r.messages.push_back({.role = "system", .content = std::move(text)});
    }
    const size_t first = r.messages.size();
    const json *msgs = field(j, "messages");
    if (!msgs) bad("missing messages", "messages");
    if (!msgs->is_array()) bad("'messages' must be an array", "messages");
    if (msgs->empty()) bad("'messages' must not be empty", "messages");
    for (size_t i = 0; i < msgs->size(); ++i) {
        const json &m = (*msgs)[i];
        const std::string where = fmt::format("messages[{}]", i);
        if (!m.is_object()) bad(where + " must be an object", "messages");
        tokenizer::ChatMessage cm;
        const auto role = get_string(m, "role");
        if (!role) bad(where + ".role is required", "messages");
        if (*role != "user" && *role != "assistant")
            bad(fmt::format("{}.role '{}' is not user or assistant (a system prompt goes in "
                            "'system')",
                            where, *role),
                "messages");
        cm.role = *role;
        const json *c = field(m, "content");
        if (!c) bad(where + ".content is required", "messages");
        read_content(*c, where, cm, [&]() -> const nlohmann::ordered_json & {
            return ordered.get().at("messages").at(i);
        });
        r.messages.push_back(std::move(cm));
    }

    // A last assistant message is the start of the answer.
    if (r.messages.back().role == "assistant") {
        if (r.messages.size() - first < 2 || r.messages[r.messages.size() - 2].role != "user")
            bad("a last message from the assistant (a prefill) must follow a user message",
                "messages");
        if (tokenizer::thinking_enabled(r.think))
            bad("a last message from the assistant (a prefill) cannot be combined with thinking",
                "messages");
        if (!r.messages.back().tool_calls.empty())
            bad("a last message from the assistant with tool_use blocks needs a user message "
                "with their tool_result after it",
                "messages");
        r.assistant_prefill = std::move(r.messages.back().content);
        r.messages.pop_back();
    }
    read_tool_choice(j, tool_names, r);
    return r;
}

}  // namespace ds4::server

#include "server/anthropic_request.h"

#include <fmt/format.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "server/request_fields.h"

namespace ds4::server {

namespace {

using nlohmann::json;
using namespace fields;

constexpr const char *kNoTools = "tool use is not supported by this server yet";

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

// A message's content: a string, or blocks. Text blocks are concatenated into the content and
// thinking blocks into the reasoning; redacted thinking (another model's encrypted reasoning) is
// skipped; every other block type is refused rather than silently dropped.
void read_content(const json &c, const std::string &where, tokenizer::ChatMessage &m) {
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
        } else if (type == "thinking") {
            m.reasoning += block_string(c[k], "thinking", bw, "messages");
        } else if (type == "redacted_thinking") {
            continue;
        } else if (type == "image" || type == "document") {
            bad(fmt::format("{}: {} blocks are not supported: this server reads text only", bw,
                            type),
                "messages");
        } else if (type.ends_with("tool_use") || type.ends_with("tool_result")) {
            bad(fmt::format("{}: {} ({} blocks)", bw, kNoTools, type), "messages");
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

}  // namespace

GenRequest parse_messages_request(std::string_view body, MessagesBody kind) {
    const json j = parse_object(body);
    GenRequest r;
    r.endpoint = Endpoint::Chat;
    if (auto m = get_string(j, "model")) r.model = *m;
    if (const json *t = field(j, "tools"); t && !(t->is_array() && t->empty()))
        bad(kNoTools, "tools");
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
        read_content(*c, where, cm);
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
        r.assistant_prefill = std::move(r.messages.back().content);
        r.messages.pop_back();
    }
    return r;
}

}  // namespace ds4::server

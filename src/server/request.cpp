#include "server/request.h"

#include <fmt/format.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "server/request_fields.h"

namespace ds4::server {

namespace {

using nlohmann::json;
using namespace fields;

// Message content: a string, null, or an array of strings and parts ({"type":"text","text":..});
// parts of other types (images, audio) are dropped.
std::string content_text(const json &c, const std::string &where) {
    if (c.is_null()) return "";
    if (c.is_string()) return c.get<std::string>();
    if (!c.is_array()) bad(where + ".content must be a string, null or an array of parts", where);
    std::string out;
    for (const json &part : c) {
        if (part.is_string()) {
            out += part.get<std::string>();
        } else if (part.is_object()) {
            const json *type = field(part, "type");
            if (type && !type->is_string()) bad(where + ".content[].type must be a string", where);
            if (type && type->get<std::string>() != "text") continue;
            const json *text = field(part, "text");
            if (!text || !text->is_string())
                bad(where + ".content[] text parts need a string 'text'", where);
            out += text->get<std::string>();
        } else {
            bad(where + ".content[] must hold strings or objects", where);
        }
    }
    return out;
}

// The fields chat and completions share: limits, sampling, stop, stream, thinking.
void parse_common(const json &j, GenRequest &r) {
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
    if (auto m = get_string(j, "model")) r.model = *m;
    r.max_tokens = get_int(j, "max_tokens", 0, kMax);
    if (auto m = get_int(j, "max_completion_tokens", 0, kMax)) r.max_tokens = m;
    if (auto t = get_number(j, "temperature", 0.0, 100.0)) r.sampling.temperature = float(*t);
    if (auto t = get_number(j, "top_p", 0.0, 1.0)) r.sampling.top_p = float(*t);
    if (auto t = get_number(j, "min_p", 0.0, 1.0)) r.sampling.min_p = float(*t);
    if (auto t = get_int(j, "top_k", 0, kMax)) r.sampling.top_k = int(*t);
    // A seed <= 0 means "from the clock", as the sampler's 0.
    if (auto s = get_int(j, "seed", std::numeric_limits<int64_t>::min(),
                         std::numeric_limits<int64_t>::max()))
        r.sampling.seed = *s > 0 ? uint64_t(*s) : 0;
    r.stop = get_stops(j, "stop", /*allow_string=*/true);
    if (auto s = get_bool(j, "stream")) r.stream = *s;
    if (const json *so = field(j, "stream_options")) {
        if (!so->is_object()) bad("'stream_options' must be an object", "stream_options");
        if (auto u = get_bool(*so, "include_usage")) r.include_usage = *u;
    }
    r.think = get_think(j, r.model);
}

}  // namespace

GenRequest parse_chat_request(std::string_view body) {
    const json j = parse_object(body);
    GenRequest r;
    r.endpoint = Endpoint::Chat;
    parse_common(j, r);
    const json *msgs = field(j, "messages");
    if (!msgs) bad("missing messages", "messages");
    if (!msgs->is_array()) bad("'messages' must be an array", "messages");
    if (msgs->empty()) bad("'messages' must not be empty", "messages");
    if (const json *tools = field(j, "tools"); tools && !(tools->is_array() && tools->empty()))
        bad("tools are not supported by this server yet", "tools");
    for (size_t i = 0; i < msgs->size(); ++i) {
        const json &m = (*msgs)[i];
        const std::string where = fmt::format("messages[{}]", i);
        if (!m.is_object()) bad(where + " must be an object", "messages");
        tokenizer::ChatMessage cm;
        cm.role = get_string(m, "role").value_or("user");
        if (cm.role != "system" && cm.role != "developer" && cm.role != "user" &&
            cm.role != "assistant" && cm.role != "tool" && cm.role != "function")
            bad(fmt::format(
                    "{}.role '{}' is not one of system, developer, user, assistant, tool, function",
                    where, cm.role),
                "messages");
        if (const json *c = field(m, "content")) cm.content = content_text(*c, where);
        if (const json *rc = field(m, "reasoning_content")) {
            if (!rc->is_string()) bad(where + ".reasoning_content must be a string", "messages");
            cm.reasoning = rc->get<std::string>();
        }
        if (const json *tc = field(m, "tool_calls"); tc && !(tc->is_array() && tc->empty()))
            bad("tool calls are not supported by this server yet", "messages");
        r.messages.push_back(std::move(cm));
    }
    return r;
}

GenRequest parse_completion_request(std::string_view body) {
    const json j = parse_object(body);
    GenRequest r;
    r.endpoint = Endpoint::Completion;
    parse_common(j, r);
    const json *p = field(j, "prompt");
    if (!p) bad("missing prompt", "prompt");
    if (p->is_string()) {
        r.prompt = p->get<std::string>();
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
        r.prompt = (*p)[0].get<std::string>();
    } else {
        bad("'prompt' must be a string (or an array of one string)", "prompt");
    }
    return r;
}

}  // namespace ds4::server

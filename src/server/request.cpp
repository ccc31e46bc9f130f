#include "server/request.h"

#include <fmt/format.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "server/request_fields.h"
#include "tokenizer/dsml_render.h"

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

// `tools`: OpenAI function tools {"type":"function","function":{name, description, parameters}},
// or a bare function object (as the reference accepts). Each becomes one schema line, in the
// client's key order; the names are returned.
std::vector<std::string> read_openai_tools(const json &j, OrderedBody &ordered, GenRequest &r) {
    return read_tools(j, r, [&](const json &t, const std::string &where, size_t i) {
        const json *fn = &t;
        if (const json *type = field(t, "type")) {
            if (*type != "function")
                bad(where + ".type must be \"function\" (the only tool type this server runs)",
                    "tools");
            fn = field(t, "function");
            if (!fn || !fn->is_object()) bad(where + ".function must be an object", "tools");
        }
        return ToolDef{fn, "parameters",
                       tokenizer::tool_schema_line(ordered.get().at("tools").at(i))};
    });
}

// `tool_choice`: "auto", "none", "required" or {"type":"function","function":{"name":N}}.
void read_tool_choice(const json &j, const std::vector<std::string> &names, GenRequest &r) {
    const json *tc = field(j, "tool_choice");
    ToolChoice choice = ToolChoice::Auto;
    std::string name;
    if (tc && tc->is_string() && *tc == "none") {
        choice = ToolChoice::None;
    } else if (tc && tc->is_string() && *tc == "required") {
        choice = ToolChoice::Required;
    } else if (tc && tc->is_object() && tc->value("type", json()) == "function" &&
               field(*tc, "function") && get_string(*field(*tc, "function"), "name")) {
        choice = ToolChoice::Named;
        name = *get_string(*field(*tc, "function"), "name");
    } else if (tc && !(tc->is_string() && *tc == "auto")) {
        bad("'tool_choice' must be \"auto\", \"none\", \"required\" or "
            "{\"type\":\"function\",\"function\":{\"name\":NAME}}",
            "tool_choice");
    }
    apply_tool_choice(r, choice, name, names, "tool_choice");
}

// An assistant message's `tool_calls`: [{"id", "type":"function", "function":{"name",
// "arguments"}}]. arguments is a JSON string (taken as written) or a JSON value (dumped in its key
// order); absent means {}.
void read_tool_calls(const json &tc, const std::string &where, size_t i, OrderedBody &ordered,
                     tokenizer::ChatMessage &cm) {
    if (!tc.is_array()) bad(where + ".tool_calls must be an array", "messages");
    for (size_t k = 0; k < tc.size(); ++k) {
        const std::string cw = fmt::format("{}.tool_calls[{}]", where, k);
        const json &c = tc[k];
        if (!c.is_object()) bad(cw + " must be an object", "messages");
        if (const json *type = field(c, "type"); type && *type != "function")
            bad(cw + ".type must be \"function\"", "messages");
        const json *fn = field(c, "function");
        if (!fn || !fn->is_object()) bad(cw + " needs a 'function' object", "messages");
        tokenizer::ToolCall call;
        call.id = get_string(c, "id").value_or("");
        const auto name = get_string(*fn, "name");
        if (!name || name->empty())
            bad(cw + ".function needs a non-empty string 'name'", "messages");
        call.name = *name;
        const json *args = field(*fn, "arguments");
        if (!args) {
            call.arguments = "{}";
        } else if (args->is_string()) {
            call.arguments = args->get<std::string>();
        } else {
            call.arguments = ordered.get()
                                 .at("messages")
                                 .at(i)
                                 .at("tool_calls")
                                 .at(k)
                                 .at("function")
                                 .at("arguments")
                                 .dump();
        }
        cm.tool_calls.push_back(std::move(call));
    }
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
    OrderedBody ordered(body);
    const std::vector<std::string> tool_names = read_openai_tools(j, ordered, r);
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
        if (const json *tc = field(m, "tool_calls")) {
            if (cm.role != "assistant")
                bad(where + ": only assistant messages have tool_calls", "messages");
            read_tool_calls(*tc, where, i, ordered, cm);
        }
        if (cm.role == "tool" || cm.role == "function") get_string(m, "tool_call_id");
        // DeepSeek's chat prefix completion: a last assistant message with "prefix": true is the
        // start of the answer, which continues it.
        if (get_bool(m, "prefix").value_or(false)) {
            if (cm.role != "assistant" || i + 1 != msgs->size() || !cm.tool_calls.empty())
                bad(where + ": \"prefix\": true is for a last assistant message without tool_calls",
                    "messages");
            if (r.messages.empty() ||
                (r.messages.back().role != "user" && r.messages.back().role != "tool" &&
                 r.messages.back().role != "function"))
                bad(where + ": a prefix message must follow a user or tool message", "messages");
            if (tokenizer::thinking_enabled(r.think))
                bad(where + ": a prefix message cannot be combined with thinking", "messages");
            r.assistant_prefill = std::move(cm.content);
            continue;
        }
        r.messages.push_back(std::move(cm));
    }
    read_tool_choice(j, tool_names, r);
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

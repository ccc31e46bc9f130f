#include "server/request.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace ds4::server {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string &message, const std::string &param = "") {
    ApiError e(400, message, "invalid_request");
    if (!param.empty()) e.extra["param"] = param;
    throw e;
}

const json *field(const json &j, const char *key) {
    // null is the same as absent (clients send "max_tokens": null for "no limit").
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}

// A whole number (1e30 is one), clamped to [lo, hi] (negative values to lo, huge ones to hi, as the
// reference does). A fraction, a string, null or a boolean is refused.
std::optional<int64_t> get_int(const json &j, const char *key, int64_t lo, int64_t hi) {
    const json *v = field(j, key);
    if (!v) return std::nullopt;
    if (v->is_number_unsigned()) {
        const uint64_t u = v->get<uint64_t>();
        return u > uint64_t(hi) ? hi : std::max<int64_t>(lo, int64_t(u));
    }
    if (v->is_number_integer()) return std::clamp<int64_t>(v->get<int64_t>(), lo, hi);
    // A whole number too large for 64 bits reaches us as a float: clamped the same way.
    if (v->is_number_float()) {
        const double d = v->get<double>();
        if (std::isfinite(d) && std::floor(d) == d)
            return d <= double(lo) ? lo : d >= double(hi) ? hi : int64_t(d);
    }
    bad(fmt::format("'{}' must be an integer", key), key);
}

std::optional<double> get_number(const json &j, const char *key, double lo, double hi) {
    const json *v = field(j, key);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(fmt::format("'{}' must be a number", key), key);
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi)
        bad(fmt::format("'{}' must be a number from {} to {}", key, lo, hi), key);
    return d;
}

std::optional<bool> get_bool(const json &j, const char *key) {
    const json *v = field(j, key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad(fmt::format("'{}' must be a boolean", key), key);
    return v->get<bool>();
}

std::optional<std::string> get_string(const json &j, const char *key) {
    const json *v = field(j, key);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad(fmt::format("'{}' must be a string", key), key);
    return v->get<std::string>();
}

json parse_object(std::string_view body) {
    check_nesting(body);
    json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) bad("invalid JSON request: the body is not valid JSON");
    if (!j.is_object()) bad("invalid JSON request: the body must be a JSON object");
    return j;
}

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
    if (const json *s = field(j, "stop")) {
        std::vector<std::string> stops;
        if (s->is_string()) {
            stops.push_back(s->get<std::string>());
        } else if (s->is_array()) {
            for (const json &x : *s) {
                if (!x.is_string()) bad("'stop' must be a string or an array of strings", "stop");
                stops.push_back(x.get<std::string>());
            }
        } else if (!s->is_null()) {
            bad("'stop' must be a string or an array of strings", "stop");
        }
        if (stops.size() > kMaxStops)
            bad(fmt::format("'stop' may hold at most {} sequences", kMaxStops), "stop");
        for (auto &x : stops) {
            if (x.size() > kMaxStopBytes)
                bad(fmt::format("a stop sequence may have at most {} bytes", kMaxStopBytes),
                    "stop");
            if (!x.empty()) r.stop.push_back(std::move(x));
        }
    }
    if (auto s = get_bool(j, "stream")) r.stream = *s;
    if (const json *so = field(j, "stream_options"); so && !so->is_null()) {
        if (!so->is_object()) bad("'stream_options' must be an object", "stream_options");
        if (auto u = get_bool(*so, "include_usage")) r.include_usage = *u;
    }

    // Thinking: off unless asked for (docs/SERVER.md, Thinking).
    std::optional<bool> think;
    if (r.model == "deepseek-reasoner") think = true;
    if (r.model == "deepseek-chat") think = false;
    tokenizer::ThinkMode on = tokenizer::ThinkMode::kHigh;
    if (auto e = get_string(j, "reasoning_effort")) {
        if (*e == "none") {
            think = false;
        } else if (*e == "max") {
            think = true;
            on = tokenizer::ThinkMode::kMax;
        } else if (*e == "xhigh" || *e == "high" || *e == "medium" || *e == "low" ||
                   *e == "minimal") {
            think = true;
        } else {
            bad(fmt::format("unknown reasoning_effort '{}'", *e), "reasoning_effort");
        }
    }
    if (const json *t = field(j, "thinking"); t && !t->is_null()) {
        if (t->is_boolean()) {
            think = t->get<bool>();
        } else if (t->is_object()) {
            auto type = get_string(*t, "type");
            if (!type || (*type != "enabled" && *type != "disabled"))
                bad("'thinking.type' must be \"enabled\" or \"disabled\"", "thinking");
            think = *type == "enabled";
        } else {
            bad("'thinking' must be a boolean or an object", "thinking");
        }
    }
    if (auto t = get_bool(j, "think")) think = *t;
    r.think = think.value_or(false) ? on : tokenizer::ThinkMode::kNone;
}

}  // namespace

void check_nesting(std::string_view body) {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (char c : body) {
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > kMaxDepth)
                bad(fmt::format("invalid JSON request: nested deeper than {} levels", kMaxDepth));
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
}

GenRequest parse_chat_request(std::string_view body) {
    const json j = parse_object(body);
    GenRequest r;
    r.endpoint = Endpoint::Chat;
    parse_common(j, r);
    const json *msgs = field(j, "messages");
    if (!msgs || msgs->is_null()) bad("missing messages", "messages");
    if (!msgs->is_array()) bad("'messages' must be an array", "messages");
    if (msgs->empty()) bad("'messages' must not be empty", "messages");
    if (const json *tools = field(j, "tools");
        tools && !tools->is_null() && !(tools->is_array() && tools->empty()))
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
        if (const json *rc = field(m, "reasoning_content"); rc && !rc->is_null()) {
            if (!rc->is_string()) bad(where + ".reasoning_content must be a string", "messages");
            cm.reasoning = rc->get<std::string>();
        }
        if (const json *tc = field(m, "tool_calls");
            tc && !tc->is_null() && !(tc->is_array() && tc->empty()))
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
    if (!p || p->is_null()) bad("missing prompt", "prompt");
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

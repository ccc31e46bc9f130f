#include "server/request_fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "server/api_error.h"
#include "server/request.h"
#include "tokenizer/dsml_parser.h"

namespace ds4::server {

void check_nesting(std::string_view body) {
    if (tokenizer::json_nesting_depth(body) > size_t(kMaxDepth))
        fields::bad(fmt::format("invalid JSON request: nested deeper than {} levels", kMaxDepth));
}

namespace fields {

void bad(const std::string &message, const std::string &param) {
    ApiError e(400, message, "invalid_request");
    if (!param.empty()) e.extra["param"] = param;
    throw e;
}

json parse_object(std::string_view body) {
    check_nesting(body);
    json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) bad("invalid JSON request: the body is not valid JSON");
    if (!j.is_object()) bad("invalid JSON request: the body must be a JSON object");
    return j;
}

const json *field(const json &j, const char *key) {
    // null is the same as absent (clients send "max_tokens": null for "no limit").
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}

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

std::vector<std::string> get_stops(const json &j, const char *key, bool allow_string) {
    const json *s = field(j, key);
    if (!s) return {};
    const std::string what =
        fmt::format("'{}' must be {}an array of strings", key, allow_string ? "a string or " : "");
    std::vector<std::string> stops;
    if (s->is_string() && allow_string) {
        stops.push_back(s->get<std::string>());
    } else if (s->is_array()) {
        for (const json &x : *s) {
            if (!x.is_string()) bad(what, key);
            stops.push_back(x.get<std::string>());
        }
    } else {
        bad(what, key);
    }
    if (stops.size() > kMaxStops)
        bad(fmt::format("'{}' may hold at most {} sequences", key, kMaxStops), key);
    std::vector<std::string> out;
    for (auto &x : stops) {
        if (x.size() > kMaxStopBytes)
            bad(fmt::format("a stop sequence may have at most {} bytes", kMaxStopBytes), key);
        if (!x.empty()) out.push_back(std::move(x));
    }
    return out;
}

const nlohmann::ordered_json &OrderedBody::get() {
    if (!j_) j_ = nlohmann::ordered_json::parse(body_);
    return *j_;
}

std::vector<std::string> read_tools(
    const json &j, GenRequest &r,
    const std::function<ToolDef(const json &tool, const std::string &where, size_t i)> &def) {
    std::vector<std::string> names;
    const json *tools = field(j, "tools");
    if (!tools) return names;
    if (!tools->is_array()) bad("'tools' must be an array", "tools");
    for (size_t i = 0; i < tools->size(); ++i) {
        const std::string where = fmt::format("tools[{}]", i);
        if (!(*tools)[i].is_object()) bad(where + " must be an object", "tools");
        ToolDef d = def((*tools)[i], where, i);
        const auto name = get_string(*d.fn, "name");
        if (!name || name->empty()) bad(where + " needs a non-empty string 'name'", "tools");
        if (const json *s = field(*d.fn, d.schema_key); s && !s->is_object())
            bad(fmt::format("{}.{} must be a JSON schema object", where, d.schema_key), "tools");
        get_string(*d.fn, "description");
        names.push_back(*name);
        r.tool_schemas.push_back(std::move(d.schema_line));
    }
    return names;
}

void apply_tool_choice(GenRequest &r, ToolChoice choice, const std::string &name,
                       const std::vector<std::string> &tool_names, const char *param) {
    if (choice == ToolChoice::None) r.tool_schemas.clear();
    if (choice == ToolChoice::None || choice == ToolChoice::Auto) return;
    const char *what = choice == ToolChoice::Named ? "a named tool" : "a required tool call";
    if (r.tool_schemas.empty())
        bad(fmt::format("'{}' asks for {} but no tools are given", param, what), param);
    if (choice == ToolChoice::Named &&
        std::find(tool_names.begin(), tool_names.end(), name) == tool_names.end())
        bad(fmt::format("'{}' names the tool '{}', which is not among the tools", param, name),
            param);
    if (tokenizer::thinking_enabled(r.think))
        bad(fmt::format("'{}' ({}) cannot be combined with thinking: a call is forced by starting "
                        "the answer with it, which would skip the reasoning",
                        param, what),
            param);
    if (!r.assistant_prefill.empty())
        bad(fmt::format("'{}' ({}) cannot be combined with an assistant prefill", param, what),
            param);
    r.tool_prefix = forced_tool_prefix(choice, name);
}

tokenizer::ThinkMode get_think(const json &j, const std::string &model, const json *effort_object,
                               const char *effort_object_param) {
    std::optional<bool> think;
    if (model == "deepseek-reasoner") think = true;
    if (model == "deepseek-chat") think = false;
    tokenizer::ThinkMode on = tokenizer::ThinkMode::kHigh;
    const char *effort_param = "reasoning_effort";
    auto effort = get_string(j, effort_param);
    if (effort_object) {
        if (auto e = get_string(*effort_object, "effort")) {
            effort = e;
            effort_param = effort_object_param;
        }
    }
    if (auto e = effort) {
        if (*e == "none") {
            think = false;
        } else if (*e == "max") {
            think = true;
            on = tokenizer::ThinkMode::kMax;
        } else if (*e == "xhigh" || *e == "high" || *e == "medium" || *e == "low" ||
                   *e == "minimal") {
            think = true;
        } else {
            bad(fmt::format("unknown {} '{}'", effort_param, *e), effort_param);
        }
    }
    if (const json *t = field(j, "thinking")) {
        if (t->is_boolean()) {
            think = t->get<bool>();
        } else if (t->is_object()) {
            auto type = get_string(*t, "type");
            if (!type || (*type != "enabled" && *type != "adaptive" && *type != "disabled"))
                bad("'thinking.type' must be \"enabled\", \"adaptive\" or \"disabled\"",
                    "thinking");
            think = *type != "disabled";
        } else {
            bad("'thinking' must be a boolean or an object", "thinking");
        }
    }
    if (auto t = get_bool(j, "think")) think = *t;
    return think.value_or(false) ? on : tokenizer::ThinkMode::kNone;
}

}  // namespace fields

}  // namespace ds4::server

#include "server/responses_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "server/request_fields.h"
#include "server/tool_calls.h"
#include "tokenizer/dsml_render.h"

namespace ds4::server {

namespace {

using nlohmann::json;
using namespace fields;

std::string required_string(const json &j, const char *key, const std::string &where,
                            const char *param) {
    const json *v = field(j, key);
    if (!v || !v->is_string()) bad(fmt::format("{} needs a string '{}'", where, key), param);
    return v->get<std::string>();
}

// Content: a string, or an array of text parts (input_text, output_text, text; for reasoning
// items reasoning_text and summary_text), concatenated. Images, files and audio are refused.
std::string content_text(const json &c, const std::string &where, const char *param) {
    if (c.is_string()) return c.get<std::string>();
    if (!c.is_array()) bad(where + " must be a string or an array of content parts", param);
    std::string out;
    for (size_t k = 0; k < c.size(); ++k) {
        const std::string pw = fmt::format("{}[{}]", where, k);
        if (!c[k].is_object()) bad(pw + " must be a content part (an object)", param);
        const std::string type = required_string(c[k], "type", pw, param);
        if (type == "input_text" || type == "output_text" || type == "text" ||
            type == "reasoning_text" || type == "summary_text")
            out += required_string(c[k], "text", pw, param);
        else if (type == "input_image" || type == "input_file" || type == "input_audio")
            bad(fmt::format("{}: {} parts are not supported: this server reads text only", pw,
                            type),
                param);
        else
            bad(fmt::format("{}: content parts of type '{}' are not supported", pw, type), param);
    }
    return out;
}

// `tools`: function tools {"type":"function","name","description","parameters","strict"}; each
// becomes the schema line of the chat path's function object (the tool without its type, in the
// client's key order). Hosted tools are refused. The names are returned.
std::vector<std::string> read_function_tools(const json &j, OrderedBody &ordered, GenRequest &r) {
    return read_tools(j, r, [&](const json &t, const std::string &where, size_t i) {
        const auto type = get_string(t, "type");
        if (type != "function")
            bad(fmt::format("{}.type must be \"function\" (the only tool type this server runs)",
                            where),
                "tools");
        get_bool(t, "strict");
        nlohmann::ordered_json fn = ordered.get().at("tools").at(i);
        fn.erase("type");
        return ToolDef{&t, "parameters", tokenizer::tool_schema_line(fn)};
    });
}

// `tool_choice`: "auto", "none", "required" or {"type":"function","name":N}.
void read_tool_choice(const json &j, const std::vector<std::string> &names, GenRequest &r) {
    const json *tc = field(j, "tool_choice");
    ToolChoice choice = ToolChoice::Auto;
    std::string name;
    if (tc && *tc == "none") {
        choice = ToolChoice::None;
    } else if (tc && *tc == "required") {
        choice = ToolChoice::Required;
    } else if (tc && tc->is_object() && tc->value("type", json()) == "function" &&
               get_string(*tc, "name")) {
        choice = ToolChoice::Named;
        name = *get_string(*tc, "name");
    } else if (tc && *tc != "auto") {
        bad("'tool_choice' must be \"auto\", \"none\", \"required\" or "
            "{\"type\":\"function\",\"name\":NAME}",
            "tool_choice");
    }
    apply_tool_choice(r, choice, name, names, "tool_choice");
}

}  // namespace

std::vector<tokenizer::ChatMessage> read_input_items(const json &input, const char *param) {
    std::vector<tokenizer::ChatMessage> out;
    if (input.is_string()) {
        out.push_back({.role = "user", .content = input.get<std::string>()});
        return out;
    }
    if (!input.is_array())
        bad(fmt::format("'{}' must be a string or an array of items", param), param);
    std::string reasoning;  // held for the next assistant message
    auto assistant = [&](std::string content) {
        out.push_back({.role = "assistant", .content = std::move(content)});
        out.back().reasoning = std::exchange(reasoning, "");
    };
    for (size_t i = 0; i < input.size(); ++i) {
        const json &item = input[i];
        const std::string where = fmt::format("{}[{}]", param, i);
        if (!item.is_object()) bad(where + " must be an object", param);
        const std::string type =
            get_string(item, "type").value_or(field(item, "role") ? "message" : "");
        if (type == "message") {
            const std::string role = required_string(item, "role", where, param);
            if (role != "user" && role != "assistant" && role != "system" && role != "developer")
                bad(fmt::format("{}.role '{}' is not one of user, assistant, system, developer",
                                where, role),
                    param);
            const json *c = field(item, "content");
            if (!c) bad(where + " needs a 'content'", param);
            std::string text = content_text(*c, where + ".content", param);
            if (role == "assistant")
                assistant(std::move(text));
            else
                out.push_back({.role = role, .content = std::move(text)});
        } else if (type == "function_call") {
            tokenizer::ToolCall call;
            call.id = required_string(item, "call_id", where, param);
            call.name = required_string(item, "name", where, param);
            if (call.name.empty()) bad(where + ".name must not be empty", param);
            call.arguments = get_string(item, "arguments").value_or("{}");
            if (out.empty() || out.back().role != "assistant") assistant("");
            out.back().tool_calls.push_back(std::move(call));
        } else if (type == "function_call_output") {
            required_string(item, "call_id", where, param);
            const json *o = field(item, "output");
            if (!o) bad(where + " needs an 'output'", param);
            out.push_back({.role = "tool", .content = content_text(*o, where + ".output", param)});
        } else if (type == "reasoning") {
            const json *c = field(item, "content");
            if (!c) c = field(item, "summary");
            if (c)
                reasoning += content_text(
                    *c, where + (field(item, "content") ? ".content" : ".summary"), param);
        } else if (type.empty()) {
            bad(where + " needs a string 'type' (or a 'role')", param);
        } else {
            bad(fmt::format("{}: items of type '{}' are not supported", where, type), param);
        }
    }
    return out;
}

ResponsesRequest parse_responses_request(std::string_view body) {
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
    const json j = parse_object(body);
    ResponsesRequest rr;
    GenRequest &r = rr.gen;
    r.endpoint = Endpoint::Chat;
    if (auto m = get_string(j, "model")) r.model = *m;
    r.max_tokens = get_int(j, "max_output_tokens", 0, kMax);
    if (auto t = get_number(j, "temperature", 0.0, 2.0)) r.sampling.temperature = float(*t);
    if (auto t = get_number(j, "top_p", 0.0, 1.0)) r.sampling.top_p = float(*t);
    if (auto s = get_bool(j, "stream")) r.stream = *s;
    rr.store = get_bool(j, "store").value_or(true);
    rr.instructions = get_string(j, "instructions");
    rr.previous_response_id = get_string(j, "previous_response_id").value_or("");
    if (field(j, "conversation"))
        bad("'conversation' is not supported: continue with previous_response_id, or send the "
            "whole input",
            "conversation");
    const json *metadata = field(j, "metadata");
    if (metadata && !metadata->is_object()) bad("'metadata' must be an object", "metadata");
    const json *reasoning = field(j, "reasoning");
    if (reasoning && !reasoning->is_object()) bad("'reasoning' must be an object", "reasoning");
    if (reasoning) get_string(*reasoning, "summary");
    r.think = get_think(j, r.model, reasoning, "reasoning.effort");
    const auto parallel = get_bool(j, "parallel_tool_calls");

    const json *input = field(j, "input");
    if (!input) bad("missing input", "input");
    rr.input = read_input_items(*input);
    if (rr.input.empty()) bad("'input' must not be empty", "input");
    rr.input_items = list_input_items(*input);
    OrderedBody ordered(body);
    const std::vector<std::string> tool_names = read_function_tools(j, ordered, r);
    read_tool_choice(j, tool_names, r);

    const json none;
    rr.echo = {{"instructions", rr.instructions ? json(*rr.instructions) : none},
               {"max_output_tokens", r.max_tokens ? json(*r.max_tokens) : none},
               {"metadata", metadata ? *metadata : json::object()},
               {"parallel_tool_calls", parallel.value_or(true)},
               {"previous_response_id",
                rr.previous_response_id.empty() ? none : json(rr.previous_response_id)},
               {"reasoning",
                {{"effort", reasoning ? reasoning->value("effort", none) : none},
                 {"summary", reasoning ? reasoning->value("summary", none) : none}}},
               {"store", rr.store},
               {"temperature", r.sampling.temperature},
               {"text", {{"format", {{"type", "text"}}}}},
               {"tool_choice", field(j, "tool_choice") ? j.at("tool_choice") : json("auto")},
               {"tools", field(j, "tools") ? j.at("tools") : json::array()},
               {"top_p", r.sampling.top_p},
               {"truncation", "disabled"},
               {"user", none}};
    return rr;
}

void with_history(ResponsesRequest &r, std::vector<tokenizer::ChatMessage> history) {
    std::vector<tokenizer::ChatMessage> &m = r.gen.messages;
    m.clear();
    if (r.instructions && !r.instructions->empty())
        m.push_back({.role = "system", .content = *r.instructions});
    m.insert(m.end(), std::make_move_iterator(history.begin()),
             std::make_move_iterator(history.end()));
    m.insert(m.end(), r.input.begin(), r.input.end());
}

json list_input_items(const json &input) {
    json items = json::array();
    if (input.is_string()) {
        items.push_back({{"id", make_tool_id("msg_")},
                         {"type", "message"},
                         {"role", "user"},
                         {"content", json::array({{{"type", "input_text"}, {"text", input}}})}});
        return items;
    }
    for (json item : input) {
        const bool message = !item.contains("type") || item["type"] == "message";
        if (message) {
            item["type"] = "message";
            if (item.contains("content") && item["content"].is_string()) {
                const bool assistant = item.value("role", "") == "assistant";
                item["content"] = json::array({{{"type", assistant ? "output_text" : "input_text"},
                                                {"text", item["content"]}}});
            }
        }
        if (!item.contains("id") || !item["id"].is_string())
            item["id"] = make_tool_id(message ? "msg_" : "item_");
        items.push_back(std::move(item));
    }
    return items;
}

json input_items_page(const json &items, size_t limit, bool ascending, const std::string &after) {
    std::vector<const json *> order;
    for (const json &item : items) order.push_back(&item);
    if (!ascending) std::reverse(order.begin(), order.end());
    size_t start = 0;
    if (!after.empty()) {
        start = order.size();
        for (size_t i = 0; i < order.size(); ++i)
            if ((*order[i])["id"] == after) {
                start = i + 1;
                break;
            }
    }
    json data = json::array();
    for (size_t i = start; i < order.size() && data.size() < limit; ++i) data.push_back(*order[i]);
    const json none;
    return {{"object", "list"},
            {"data", data},
            {"first_id", data.empty() ? none : data.front()["id"]},
            {"last_id", data.empty() ? none : data.back()["id"]},
            {"has_more", start + data.size() < order.size()}};
}

}  // namespace ds4::server

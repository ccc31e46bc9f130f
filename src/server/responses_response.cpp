#include "server/responses_response.h"

#include <fmt/format.h>

#include "server/tool_calls.h"

namespace ds4::server {

namespace {

using nlohmann::json;

// The content part of a reasoning item (reasoning_text) or of a message (output_text).
json text_part(bool reasoning, const std::string &text) {
    if (reasoning) return {{"type", "reasoning_text"}, {"text", text}};
    return {{"type", "output_text"},
            {"annotations", json::array()},
            {"logprobs", json::array()},
            {"text", text}};
}

}  // namespace

json responses_usage(const GenResult &g) {
    return {{"input_tokens", g.prompt_tokens},
            {"input_tokens_details",
             {{"cached_tokens", g.cached_tokens},
              {"cache_write_tokens", g.prompt_tokens - g.cached_tokens}}},
            {"output_tokens", g.completion_tokens},
            {"output_tokens_details", {{"reasoning_tokens", g.reasoning_tokens}}},
            {"total_tokens", g.prompt_tokens + g.completion_tokens}};
}

const char *responses_status(const GenResult &g) {
    return g.finish_reason == "length" ? "incomplete" : "completed";
}

json response_object(const ResponseMeta &m, const std::string &status, const json &output,
                     const json &usage) {
    json r = m.echo;
    r["id"] = m.id;
    r["object"] = "response";
    r["created_at"] = m.created_at;
    r["status"] = status;
    r["error"] = nullptr;
    r["incomplete_details"] =
        status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr);
    r["model"] = m.model;
    r["output"] = output;
    r["usage"] = usage;
    return r;
}

ResponsesStream::ResponsesStream(ResponseMeta meta) : meta_(std::move(meta)) {}

SseEvent ResponsesStream::event(std::string name, json data) {
    data["type"] = name;
    data["sequence_number"] = seq_++;
    return {std::move(name), std::move(data)};
}

SseEvent ResponsesStream::text_event(const char *what, const char *key, const std::string &value) {
    const bool reasoning = open_ == Item::Reasoning;
    json j = at(true);
    j[key] = value;
    if (!reasoning) j["logprobs"] = json::array();
    return event(fmt::format("response.{}.{}", reasoning ? "reasoning_text" : "output_text", what),
                 std::move(j));
}

json ResponsesStream::at(bool with_content) const {
    json j = {{"item_id", output_.back()["id"]}, {"output_index", output_.size() - 1}};
    if (with_content) j["content_index"] = 0;
    return j;
}

std::vector<SseEvent> ResponsesStream::start() {
    response_ = response_object(meta_, "in_progress", json::array(), nullptr);
    return {event("response.created", {{"response", response_}}),
            event("response.in_progress", {{"response", response_}})};
}

void ResponsesStream::open(Item kind, std::vector<SseEvent> &out) {
    if (open_ == kind && kind != Item::FunctionCall) return;
    close("completed", out);
    open_ = kind;
    text_.clear();
    json item;
    if (kind == Item::Reasoning) {
        item = {{"id", make_tool_id("rs_")},
                {"type", "reasoning"},
                {"summary", json::array()},
                {"content", json::array()},
                {"status", "in_progress"}};
    } else if (kind == Item::Message) {
        had_message_ = true;
        item = {{"id", make_tool_id("msg_")},
                {"type", "message"},
                {"status", "in_progress"},
                {"content", json::array()},
                {"role", "assistant"}};
    } else {
        had_call_ = true;
        item = {{"id", make_tool_id("fc_")},        {"type", "function_call"},
                {"status", "in_progress"},          {"arguments", ""},
                {"call_id", make_tool_id("call_")}, {"name", ""}};
    }
    output_.push_back(item);
    out.push_back(event("response.output_item.added",
                        {{"output_index", output_.size() - 1}, {"item", item}}));
    if (kind == Item::FunctionCall) return;
    json added = at(true);
    added["part"] = text_part(kind == Item::Reasoning, "");
    out.push_back(event("response.content_part.added", std::move(added)));
}

void ResponsesStream::close(const char *status, std::vector<SseEvent> &out) {
    if (open_ == Item::None) return;
    json &item = output_.back();
    if (open_ == Item::FunctionCall) {
        json done = at(false);
        done["arguments"] = text_;
        out.push_back(event("response.function_call_arguments.done", std::move(done)));
        item["arguments"] = text_;
    } else {
        const bool reasoning = open_ == Item::Reasoning;
        out.push_back(text_event("done", "text", text_));
        json part_done = at(true);
        part_done["part"] = text_part(reasoning, text_);
        out.push_back(event("response.content_part.done", std::move(part_done)));
        item["content"] = json::array({text_part(reasoning, text_)});
    }
    item["status"] = status;
    out.push_back(
        event("response.output_item.done", {{"output_index", output_.size() - 1}, {"item", item}}));
    open_ = Item::None;
}

std::vector<SseEvent> ResponsesStream::delta(const Delta &d) {
    std::vector<SseEvent> out;
    for (const bool reasoning : {true, false}) {
        const std::string &text = reasoning ? d.reasoning : d.content;
        if (text.empty()) continue;
        open(reasoning ? Item::Reasoning : Item::Message, out);
        text_ += text;
        out.push_back(text_event("delta", "delta", text));
    }
    for (const ToolEvent &e : d.tools) {
        if (e.kind == ToolEvent::Kind::Start) {
            open(Item::FunctionCall, out);
            output_.back()["name"] = e.text;
            out.back().data["item"]["name"] = e.text;
        } else if (e.kind == ToolEvent::Kind::Arguments && open_ == Item::FunctionCall) {
            text_ += e.text;
            json piece = at(false);
            piece["delta"] = e.text;
            out.push_back(event("response.function_call_arguments.delta", std::move(piece)));
        } else if (e.kind == ToolEvent::Kind::End) {
            close(e.complete ? "completed" : "incomplete", out);
        }
    }
    return out;
}

std::vector<SseEvent> ResponsesStream::finish(const GenResult &g) {
    std::vector<SseEvent> out;
    const std::string status = responses_status(g);
    if (!had_message_ && !had_call_) open(Item::Message, out);
    close(status.c_str(), out);
    response_ = response_object(meta_, status, output_, responses_usage(g));
    out.push_back(event(status == "completed" ? "response.completed" : "response.incomplete",
                        {{"response", response_}}));
    return out;
}

json response_from_result(const ResponseMeta &m, const GenResult &g) {
    ResponsesStream s(m);
    s.start();
    s.delta({.content = "", .reasoning = g.reasoning, .tools = {}});
    s.delta({.content = g.content, .reasoning = "", .tools = {}});
    for (size_t i = 0; i < g.tool_calls.size(); ++i) {
        using K = ToolEvent::Kind;
        const tokenizer::ToolCall &c = g.tool_calls[i];
        const bool complete = !(g.tool_call_cut && i + 1 == g.tool_calls.size());
        s.delta({.content = "",
                 .reasoning = "",
                 .tools = {{K::Start, i, c.name},
                           {K::Arguments, i, c.arguments},
                           {K::End, i, "", complete}}});
    }
    s.finish(g);
    return s.response();
}

}  // namespace ds4::server

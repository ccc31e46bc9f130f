#include "server/anthropic_response.h"

#include "server/tool_calls.h"

namespace ds4::server {

namespace {

using nlohmann::json;

const char *error_type(int status) {
    switch (status) {
        case 401:
            return "authentication_error";
        case 403:
            return "permission_error";
        case 404:
            return "not_found_error";
        case 413:
            return "request_too_large";
        case 429:
            return "rate_limit_error";
        case 503:
        case 529:
            return "overloaded_error";
        default:
            return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

json stop_sequence(const GenResult &g) {
    return g.stop_sequence ? json(g.matched_stop) : json(nullptr);
}

json thinking_block(const std::string &thinking, const std::string &signature) {
    return {{"type", "thinking"}, {"thinking", thinking}, {"signature", signature}};
}

json text_block(const std::string &text) {
    return {{"type", "text"}, {"text", text}};
}

// {"type":"tool_use","id","name","input"}; arguments that are not a JSON object (they always are
// when they come from server/tool_calls.h) are passed as {"arguments": TEXT}.
json tool_use_block(const std::string &id, const std::string &name, const std::string &arguments) {
    json input = json::parse(arguments, nullptr, /*allow_exceptions=*/false);
    if (!input.is_object()) input = {{"arguments", arguments}};
    return {{"type", "tool_use"}, {"id", id}, {"name", name}, {"input", input}};
}

SseEvent event(const char *name, json data) {
    data["type"] = name;
    return {name, std::move(data)};
}

}  // namespace

json anthropic_error_body(int status, const std::string &message, const json &extra) {
    json e = {{"type", error_type(status)}, {"message", message}};
    for (const auto &[k, v] : extra.items()) e[k] = v;
    return {{"type", "error"}, {"error", e}};
}

const char *anthropic_stop_reason(const GenResult &g) {
    if (g.finish_reason == "tool_calls") return "tool_use";
    if (g.stop_sequence) return "stop_sequence";
    if (g.stop == runtime::StopReason::Length) return "max_tokens";
    if (g.stop == runtime::StopReason::ContextFull) return "model_context_window_exceeded";
    return "end_turn";
}

json anthropic_usage(const GenResult &g) {
    return {{"input_tokens", g.prompt_tokens - g.cached_tokens},
            {"output_tokens", g.completion_tokens},
            {"cache_read_input_tokens", g.cached_tokens},
            {"cache_creation_input_tokens", 0}};
}

json anthropic_message(const GenResult &g, const std::string &id, const std::string &model) {
    json content = json::array();
    if (!g.reasoning.empty()) content.push_back(thinking_block(g.reasoning, id));
    if (!g.content.empty() || g.tool_calls.empty()) content.push_back(text_block(g.content));
    for (const tokenizer::ToolCall &c : g.tool_calls)
        content.push_back(tool_use_block(make_tool_id("toolu_"), c.name, c.arguments));
    return {{"id", id},
            {"type", "message"},
            {"role", "assistant"},
            {"model", model},
            {"content", content},
            {"stop_reason", anthropic_stop_reason(g)},
            {"stop_sequence", stop_sequence(g)},
            {"usage", anthropic_usage(g)}};
}

AnthropicStream::AnthropicStream(std::string id, std::string model)
    : id_(std::move(id)), model_(std::move(model)) {}

std::vector<SseEvent> AnthropicStream::start(const GenResult &g) const {
    json usage = anthropic_usage(g);
    usage["output_tokens"] = 0;
    return {event("message_start", {{"message",
                                     {{"id", id_},
                                      {"type", "message"},
                                      {"role", "assistant"},
                                      {"model", model_},
                                      {"content", json::array()},
                                      {"stop_reason", nullptr},
                                      {"stop_sequence", nullptr},
                                      {"usage", usage}}}})};
}

void AnthropicStream::open(Block b, std::vector<SseEvent> &out) {
    if (open_ == b) return;
    close(out);
    open_ = b;
    had_text_ = had_text_ || b == Block::Text;
    out.push_back(
        event("content_block_start",
              {{"index", ++index_},
               {"content_block", b == Block::Text ? text_block("") : thinking_block("", "")}}));
}

void AnthropicStream::close(std::vector<SseEvent> &out) {
    if (open_ == Block::None) return;
    if (open_ == Block::Thinking)
        out.push_back(event(
            "content_block_delta",
            {{"index", index_}, {"delta", {{"type", "signature_delta"}, {"signature", id_}}}}));
    out.push_back(event("content_block_stop", {{"index", index_}}));
    open_ = Block::None;
}

std::vector<SseEvent> AnthropicStream::delta(const Delta &d) {
    std::vector<SseEvent> out;
    if (!d.reasoning.empty()) {
        open(Block::Thinking, out);
        out.push_back(event("content_block_delta",
                            {{"index", index_},
                             {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}}));
    }
    if (!d.content.empty()) {
        open(Block::Text, out);
        out.push_back(
            event("content_block_delta",
                  {{"index", index_}, {"delta", {{"type", "text_delta"}, {"text", d.content}}}}));
    }
    for (const ToolEvent &e : d.tools) {
        if (e.kind == ToolEvent::Kind::Start) {
            close(out);
            open_ = Block::ToolUse;
            had_tool_ = true;
            json block = tool_use_block(make_tool_id("toolu_"), e.text, "{}");
            out.push_back(
                event("content_block_start", {{"index", ++index_}, {"content_block", block}}));
        } else if (e.kind == ToolEvent::Kind::Arguments) {
            out.push_back(
                event("content_block_delta",
                      {{"index", index_},
                       {"delta", {{"type", "input_json_delta"}, {"partial_json", e.text}}}}));
        } else {
            close(out);
        }
    }
    return out;
}

std::vector<SseEvent> AnthropicStream::finish(const GenResult &g) {
    std::vector<SseEvent> out;
    if (!had_text_ && !had_tool_) open(Block::Text, out);
    close(out);
    out.push_back(event("message_delta", {{"delta",
                                           {{"stop_reason", anthropic_stop_reason(g)},
                                            {"stop_sequence", stop_sequence(g)}}},
                                          {"usage", anthropic_usage(g)}}));
    out.push_back(event("message_stop", json::object()));
    return out;
}

}  // namespace ds4::server

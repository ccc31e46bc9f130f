#pragma once
// The answers of POST /v1/responses in the OpenAI Responses shapes (docs/SERVER.md, Responses):
// the response object and the events of a stream. Pure functions of the engine's results; the
// HTTP layer writes them.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/engine.h"
#include "server/sse_event.h"

namespace ds4::server {

// What a response object says besides its output: its id, creation time, model, and the
// request's settings it repeats (ResponsesRequest::echo).
struct ResponseMeta {
    std::string id;  // resp_ + 32 hex
    int64_t created_at = 0;
    std::string model;
    nlohmann::json echo = nlohmann::json::object();
};

// {"input_tokens": the prompt, "input_tokens_details": {"cached_tokens": the reused prefix,
// "cache_write_tokens": the rest}, "output_tokens", "output_tokens_details":
// {"reasoning_tokens"}, "total_tokens"}.
nlohmann::json responses_usage(const GenResult &g);

// "incomplete" when the token limit or a full context ended the answer (finish "length": its text,
// or a call it cut), else "completed".
const char *responses_status(const GenResult &g);

// {"id","object":"response","created_at","status","error":null,"incomplete_details","model",
// "output","usage", ...echo}. incomplete_details is {"reason":"max_output_tokens"} when status is
// incomplete, else null.
nlohmann::json response_object(const ResponseMeta &m, const std::string &status,
                               const nlohmann::json &output, const nlohmann::json &usage);

// The events of a streamed response, each with its sequence_number (from 0), in the order the
// engine produces the answer:
//   start   response.created, response.in_progress (status in_progress, output [], usage null)
//   delta   per kind of text an output item, opened when the kind changes (the open one closed
//           first): response.output_item.added (reasoning or message, in_progress),
//           response.content_part.added (reasoning_text or output_text, empty), then per piece
//           response.reasoning_text.delta or response.output_text.delta; closing it is
//           response.reasoning_text.done or response.output_text.done,
//           response.content_part.done, response.output_item.done. Per tool call a
//           function_call item: response.output_item.added (arguments ""),
//           response.function_call_arguments.delta per piece, .done, response.output_item.done
//           (the item incomplete when the call was cut: ToolEvent::complete)
//   finish  the open item closed (incomplete when the response is), an empty message when
//           neither text nor a call came, then response.completed or response.incomplete with
//           the whole response
// Item ids: rs_, msg_, fc_ + 32 hex; call ids call_ + 32 hex.
class ResponsesStream {
  public:
    explicit ResponsesStream(ResponseMeta meta);
    std::vector<SseEvent> start();
    std::vector<SseEvent> delta(const Delta &d);
    std::vector<SseEvent> finish(const GenResult &g);
    // The response object; complete after finish.
    const nlohmann::json &response() const { return response_; }

  private:
    enum class Item { None, Reasoning, Message, FunctionCall };
    SseEvent event(std::string name, nlohmann::json data);
    // response.reasoning_text.WHAT or response.output_text.WHAT (with logprobs) of the open item,
    // with `key`: `value`.
    SseEvent text_event(const char *what, const char *key, const std::string &value);
    void open(Item kind, std::vector<SseEvent> &out);
    void close(const char *status, std::vector<SseEvent> &out);
    // The open item's position fields: item_id, output_index (and content_index for text).
    nlohmann::json at(bool with_content) const;

    ResponseMeta meta_;
    uint64_t seq_ = 0;
    nlohmann::json output_ = nlohmann::json::array();  // items, the open one last
    Item open_ = Item::None;
    std::string text_;  // of the open item: its text, or a call's arguments
    bool had_message_ = false, had_call_ = false;
    nlohmann::json response_;
};

// The non-streamed response: the result replayed through ResponsesStream, so that it has the
// items of a stream.
nlohmann::json response_from_result(const ResponseMeta &m, const GenResult &g);

}  // namespace ds4::server

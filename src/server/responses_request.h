#pragma once
// The request body of POST /v1/responses (the OpenAI Responses API), parsed and checked into the
// GenRequest the chat path runs (docs/SERVER.md, Responses). Every defect is an ApiError 400
// (request_fields.h): `input` missing, empty or of the wrong type, an item or content part of a
// type this server does not read (images, files, audio: the model reads text only; hosted tools),
// a message role other than user, assistant, system, developer, a bad tool definition or
// tool_choice, `conversation` (not supported: previous_response_id is), a field of the wrong type
// or out of range. Unknown fields are ignored.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/request.h"

namespace ds4::server {

struct ResponsesRequest {
    // What the engine runs. Its messages are set by with_history: the instructions (a system
    // message), the conversation of previous_response_id, then `input`.
    GenRequest gen;
    std::vector<tokenizer::ChatMessage> input;  // the `input` items as chat messages
    nlohmann::json input_items;  // the same items as GET /v1/responses/{id}/input_items lists them
    std::optional<std::string> instructions;
    std::string previous_response_id;  // empty: none
    bool store = true;
    // The request's settings as the response object repeats them: instructions,
    // max_output_tokens, metadata, parallel_tool_calls, previous_response_id, reasoning, store,
    // temperature, text, tool_choice, tools, top_p, truncation, user.
    nlohmann::json echo;
};

ResponsesRequest parse_responses_request(std::string_view body);

// The `input` (a string or an array of items, already validated by read_input_items) as a list of
// items, OpenAI's input_items shape: a string is one user message; a message's string content
// becomes one input_text part (output_text for the assistant), a message without `type` gets
// "type":"message"; items without an id get one (msg_ + 32 hex digits for messages, item_ +
// 32 hex for others), so a listing can be paged by id. Other fields are kept as sent.
nlohmann::json list_input_items(const nlohmann::json &input);

// A page of such a list, as GET .../input_items answers it: `order` "asc" (as sent) or "desc"
// (the default, newest first), after the item `after` (when not empty; none found: an empty
// page), at most `limit` items: {"object":"list","data","first_id","last_id","has_more"}.
nlohmann::json input_items_page(const nlohmann::json &items, size_t limit, bool ascending,
                                const std::string &after);

// Input items (a string is one user message) as chat messages, as a client's replayed output is
// read too: `message` items (role user, assistant, system or developer; content a string or
// input_text / output_text parts, concatenated) one message each; a `function_call` (call_id,
// name, arguments JSON string) is a tool call of the assistant message before it, or of a new
// one; a `function_call_output` (call_id, output string or text parts) is a tool message; the
// text of a `reasoning` item (its reasoning_text content, else its summary) becomes the
// reasoning of the next assistant message. `param` names the field in errors.
std::vector<tokenizer::ChatMessage> read_input_items(const nlohmann::json &input,
                                                     const char *param = "input");

// Sets r.gen.messages: the instructions, `history` (the previous response's conversation), the
// input.
void with_history(ResponsesRequest &r, std::vector<tokenizer::ChatMessage> history);

}  // namespace ds4::server

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
    std::optional<std::string> instructions;
    std::string previous_response_id;  // empty: none
    bool store = true;
    // The request's settings as the response object repeats them: instructions,
    // max_output_tokens, metadata, parallel_tool_calls, previous_response_id, reasoning, store,
    // temperature, text, tool_choice, tools, top_p, truncation, user.
    nlohmann::json echo;
};

ResponsesRequest parse_responses_request(std::string_view body);

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

#pragma once
// The request body of POST /v1/messages (the Anthropic Messages API) and of
// POST /v1/messages/count_tokens, parsed and checked into the GenRequest the chat path runs
// (docs/SERVER.md, Anthropic messages). Every defect is an ApiError 400 (request_fields.h):
// `messages` missing or empty, a role other than user/assistant, a content block of a type this
// server does not read (image, document: the model reads text only; server-tool blocks), a bad
// tool definition or tool_choice (docs/SERVER.md, Tool calls), a missing `max_tokens` or one below
// 1, a field of the wrong type or out of range. Unknown fields, `metadata` and `cache_control` are
// ignored.
#include <string_view>

#include "server/request.h"

namespace ds4::server {

// Create: a /v1/messages body, `max_tokens` required. CountTokens: a count_tokens body, which has
// no `max_tokens` and whose sampling fields are not read.
enum class MessagesBody { Create, CountTokens };

// `system` (a string or text blocks, joined with newlines; blocks starting with `x-anthropic-`
// are dropped) becomes the first message. A last message from the assistant is a prefill: its text
// is GenRequest::assistant_prefill, which the answer continues (not with thinking).
GenRequest parse_messages_request(std::string_view body, MessagesBody kind = MessagesBody::Create);

}  // namespace ds4::server

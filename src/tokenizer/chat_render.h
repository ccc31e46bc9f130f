#pragma once
// Renders an API conversation (OpenAI / Anthropic style messages) to the prompt text the
// reference server feeds to the tokenizer with special-token recognition (docs/MODEL.md 7.3,
// docs/SURFACES.md 3.6):
//
//   BOS [Think Max prefix] SYSTEM
//   then per message:
//     user            <｜User｜>content
//     tool, function  [<｜User｜> unless the previous message was a tool result]
//                     <tool_result>content</tool_result>   (an embedded </tool_result> is
//                                                           written &lt;/tool_result>)
//     assistant       [<｜Assistant｜> + think part, when a user/tool turn precedes it]
//                     content + tool-call DSML + <｜end▁of▁sentence｜>
//   and, when the last message is from the user or a tool: <｜Assistant｜> + <think> | </think>
//
// SYSTEM is the tools prompt (when tools are given) followed by every system/developer message,
// joined with blank lines. The think part of an assistant turn is </think> without thinking;
// with thinking it is <think>reasoning</think> when the conversation has tool context (tools
// given, or any tool call or tool result in the history) or the message comes after the last
// user/tool message, and a bare </think> otherwise: the reasoning of earlier turns is dropped.
#include <span>
#include <string>
#include <vector>

#include "tokenizer/chat_prompt.h"
#include "tokenizer/tool_call.h"

namespace ds4::tokenizer {

struct ChatMessage {
    std::string role;  // system, developer, user, assistant, tool, function
    std::string content;
    std::string reasoning;             // assistant only
    std::vector<ToolCall> tool_calls;  // assistant only
    // The exact DSML block the model sampled for these calls, when known: replayed verbatim
    // instead of the canonical rendering so the prompt keeps the tokens already in the cache.
    std::string raw_dsml;
};

// `tool_schemas`: one raw JSON function schema per tool (see tool_schema_line); empty = no tools.
std::string render_chat_prompt(std::span<const ChatMessage> messages,
                               std::span<const std::string> tool_schemas, ThinkMode mode);

}  // namespace ds4::tokenizer

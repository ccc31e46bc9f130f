#pragma once
// What the request parsers share (docs/SERVER.md, Fields honoured): the body read as a JSON
// object, type-strict readers of one field, and the field groups that the OpenAI and Anthropic
// bodies read the same way (stop sequences, the thinking controls). Every defect is an ApiError
// with status 400 whose `param` names the field. A field that is null counts as absent.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_prompt.h"

namespace ds4::server {

inline constexpr int kMaxDepth = 256;    // nesting of arrays and objects in a body
inline constexpr size_t kMaxStops = 16;  // stop sequences per request
inline constexpr size_t kMaxStopBytes = 1024;

// Throws ApiError 400 when `body` nests arrays/objects deeper than kMaxDepth (checked before the
// JSON parser sees it, so a hostile body costs no memory).
void check_nesting(std::string_view body);

namespace fields {

using nlohmann::json;

// Throws ApiError 400 (code invalid_request) with `param` when it is given.
[[noreturn]] void bad(const std::string &message, const std::string &param = "");

// The body: nesting checked, parsed, an object.
json parse_object(std::string_view body);

// The member `key` of `j`, or nullptr when it is absent or null.
const json *field(const json &j, const char *key);

// A whole number (1e30 is one), clamped to [lo, hi]: negative values to lo, huge ones to hi, as
// the reference does. A fraction, a string or a boolean is refused.
std::optional<int64_t> get_int(const json &j, const char *key, int64_t lo, int64_t hi);
// A finite number in [lo, hi].
std::optional<double> get_number(const json &j, const char *key, double lo, double hi);
std::optional<bool> get_bool(const json &j, const char *key);
std::optional<std::string> get_string(const json &j, const char *key);

// Stop sequences under `key`: an array of strings (or a single string when `allow_string`), at
// most kMaxStops of at most kMaxStopBytes each. Empty strings are dropped.
std::vector<std::string> get_stops(const json &j, const char *key, bool allow_string);

// The thinking controls (docs/SERVER.md, Thinking), the later winning: the model alias
// (deepseek-reasoner on, deepseek-chat off), reasoning_effort (or, when `output_config` is given,
// Anthropic's output_config.effort in its place), thinking (a boolean or {"type": "enabled" |
// "adaptive" | "disabled"}; other members such as budget_tokens are ignored), think. Off when none
// is given.
tokenizer::ThinkMode get_think(const json &j, const std::string &model,
                               const json *output_config = nullptr);

}  // namespace fields

}  // namespace ds4::server

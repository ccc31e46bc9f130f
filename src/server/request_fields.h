#pragma once
// What the request parsers share (docs/SERVER.md, Fields honoured): the body read as a JSON
// object, type-strict readers of one field, and the field groups that the OpenAI and Anthropic
// bodies read the same way (stop sequences, the thinking controls). Every defect is an ApiError
// with status 400 whose `param` names the field. A field that is null counts as absent.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_calls.h"
#include "tokenizer/chat_prompt.h"

namespace ds4::server {

struct GenRequest;

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
// (deepseek-reasoner on, deepseek-chat off), reasoning_effort (or, when `effort_object` is given
// and has an `effort`, that one in its place: Anthropic's output_config.effort, the Responses
// API's reasoning.effort; `effort_param` names it in errors), thinking (a boolean or
// {"type": "enabled" | "adaptive" | "disabled"}; other members such as budget_tokens are
// ignored), think. Off when none is given.
tokenizer::ThinkMode get_think(const json &j, const std::string &model,
                               const json *effort_object = nullptr,
                               const char *effort_param = "output_config.effort");

// The body again with its objects' key order kept, parsed on first use: tool schemas and call
// arguments are rendered in the client's key order (docs/SURFACES.md 3.6).
class OrderedBody {
  public:
    explicit OrderedBody(std::string_view body) : body_(body) {}
    const nlohmann::ordered_json &get();

  private:
    std::string_view body_;
    std::optional<nlohmann::ordered_json> j_;
};

// One tool of a `tools` array, as an API defines it: the object that holds its name, description
// and schema, the schema's key, and the schema line it renders as (tokenizer/dsml_render.h).
struct ToolDef {
    const json *fn;
    const char *schema_key;
    std::string schema_line;
};

// `tools`: an array of objects, each read by `def` (which refuses what its API does not run); the
// name must be a non-empty string, the description a string, the schema an object. The schema
// lines go to r.tool_schemas; the names are returned.
std::vector<std::string> read_tools(
    const json &j, GenRequest &r,
    const std::function<ToolDef(const json &tool, const std::string &where, size_t i)> &def);

// Applies a tool_choice that parsed (`param` names the field): None drops the tools; Required and
// Named need tools, a Named tool must be among `tool_names`, and both force the call by starting
// the answer with it (GenRequest::tool_prefix), which cannot follow a prefill or skip thinking.
void apply_tool_choice(GenRequest &r, ToolChoice choice, const std::string &name,
                       const std::vector<std::string> &tool_names, const char *param);

}  // namespace fields

}  // namespace ds4::server

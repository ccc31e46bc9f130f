#include "tokenizer/dsml_parser.h"

#include <fmt/format.h>

#include <array>
#include <nlohmann/json.hpp>
#include <optional>

#include "tokenizer/special_tokens.h"

namespace ds4::tokenizer {

std::string unescape_attr(std::string_view s) {
    static constexpr std::array<std::pair<std::string_view, char>, 5> kEntities = {{
        {"&amp;", '&'},
        {"&lt;", '<'},
        {"&gt;", '>'},
        {"&quot;", '"'},
        {"&apos;", '\''},
    }};
    std::string out;
    for (size_t i = 0; i < s.size();) {
        bool replaced = false;
        if (s[i] == '&') {
            for (const auto &[entity, c] : kEntities) {
                if (s.compare(i, entity.size(), entity) == 0) {
                    out += c;
                    i += entity.size();
                    replaced = true;
                    break;
                }
            }
        }
        if (!replaced) out += s[i++];
    }
    return out;
}

namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

}  // namespace

size_t json_nesting_depth(std::string_view t) {
    int64_t depth = 0, deepest = 0;
    bool in_string = false, escaped = false;
    for (const char c : t) {
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            deepest = std::max(deepest, ++depth);
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return size_t(deepest);
}

nlohmann::ordered_json parameter_json_value(std::string_view raw) {
    size_t b = 0, e = raw.size();
    while (b < e && is_space(raw[b])) ++b;
    while (e > b && is_space(raw[e - 1])) --e;
    if (b == e) return nullptr;
    const std::string_view t = raw.substr(b, e - b);
    if (json_nesting_depth(t) > kMaxParameterDepth) return nlohmann::ordered_json(std::string(raw));
    nlohmann::ordered_json v = nlohmann::ordered_json::parse(t.begin(), t.end(), nullptr, false);
    if (v.is_discarded()) return nlohmann::ordered_json(std::string(raw));
    return v;
}

namespace {

using ordered_json = nlohmann::ordered_json;

struct Syntax {
    std::string_view calls_open, calls_close, invoke_open, invoke_close, param_open, param_close;
};

constexpr std::array<Syntax, 3> kSyntaxes = {{
    {kDsmlToolCallsOpen, kDsmlToolCallsClose, kDsmlInvokeOpen, kDsmlInvokeClose, kDsmlParameterOpen,
     kDsmlParameterClose},
    {"<DSML｜tool_calls>", "</DSML｜tool_calls>", "<DSML｜invoke", "</DSML｜invoke>",
     "<DSML｜parameter", "</DSML｜parameter>"},
    {"<tool_calls>", "</tool_calls>", "<invoke", "</invoke>", "<parameter", "</parameter>"},
}};

struct ParseError {
    size_t at;
    std::string what;
};

// Value of attribute `name` inside an opening tag, if present.
std::optional<std::string> attribute(std::string_view tag, std::string_view name) {
    const std::string needle = fmt::format(" {}=\"", name);
    const size_t at = tag.find(needle);
    if (at == std::string_view::npos) return std::nullopt;
    const size_t begin = at + needle.size();
    const size_t end = tag.find('"', begin);
    if (end == std::string_view::npos) return std::nullopt;
    return unescape_attr(tag.substr(begin, end - begin));
}

// Parses the inside of one block: invokes made of parameters, separated by whitespace.
class BlockParser {
  public:
    BlockParser(std::string_view text, size_t begin, size_t end, const Syntax &syntax)
        : s_(text), pos_(begin), end_(end), syn_(syntax) {}

    std::vector<ToolCall> parse() {
        std::vector<ToolCall> calls;
        for (skip_space(); pos_ < end_; skip_space()) calls.push_back(parse_invoke());
        if (calls.empty()) fail("a tool_calls block with no invoke");
        return calls;
    }

  private:
    [[noreturn]] void fail(std::string what) const { throw ParseError{pos_, std::move(what)}; }

    void skip_space() {
        while (pos_ < end_ && is_space(s_[pos_])) ++pos_;
    }
    bool at(std::string_view marker) const {
        return marker.size() <= end_ - pos_ && s_.compare(pos_, marker.size(), marker) == 0;
    }

    // An opening tag starting at pos_ (which is at `open`); returns the tag text, pos_ after it.
    std::string_view open_tag(std::string_view open) {
        const size_t close = s_.find('>', pos_ + open.size());
        if (close == std::string_view::npos || close >= end_)
            fail(fmt::format("unclosed {} tag", open));
        std::string_view tag = s_.substr(pos_, close + 1 - pos_);
        pos_ = close + 1;
        return tag;
    }

    ToolCall parse_invoke() {
        if (!at(syn_.invoke_open)) fail(fmt::format("expected {}", syn_.invoke_open));
        const std::string_view tag = open_tag(syn_.invoke_open);
        auto name = attribute(tag, "name");
        if (!name || name->empty()) fail("an invoke without a name attribute");
        ordered_json args = ordered_json::object();
        for (skip_space(); !at(syn_.invoke_close); skip_space()) {
            if (pos_ >= end_) fail(fmt::format("invoke '{}' is not closed", *name));
            if (!at(syn_.param_open)) {
                fail(fmt::format("expected {} or {}", syn_.param_open, syn_.invoke_close));
            }
            auto [key, value] = parse_parameter();
            args[key] = std::move(value);
        }
        pos_ += syn_.invoke_close.size();
        return ToolCall{"", std::move(*name), args.dump()};
    }

    std::pair<std::string, ordered_json> parse_parameter() {
        const std::string_view tag = open_tag(syn_.param_open);
        auto name = attribute(tag, "name");
        if (!name) fail("a parameter without a name attribute");
        const auto kind = attribute(tag, "string");
        const size_t body = pos_;
        if (!kind) {
            skip_space();
            if (at(syn_.param_open)) return {std::move(*name), parse_nested_parameters()};
            pos_ = body;
        }
        const size_t close = s_.find(syn_.param_close, body);
        if (close == std::string_view::npos || close + syn_.param_close.size() > end_) {
            fail(fmt::format("parameter '{}' is not closed", *name));
        }
        const std::string_view raw = s_.substr(body, close - body);
        pos_ = close + syn_.param_close.size();
        if (kind && *kind == "false") return {std::move(*name), parameter_json_value(raw)};
        return {std::move(*name), ordered_json(unescape_close_tag(raw))};
    }

    // Loose-XML recovery: <parameter name="outer"> <parameter ...>..</parameter> ... </parameter>
    ordered_json parse_nested_parameters() {
        ordered_json object = ordered_json::object();
        for (skip_space(); at(syn_.param_open); skip_space()) {
            auto [key, value] = parse_parameter();
            object[key] = std::move(value);
        }
        if (!at(syn_.param_close)) fail(fmt::format("expected {}", syn_.param_close));
        pos_ += syn_.param_close.size();
        return object;
    }

    std::string unescape_close_tag(std::string_view raw) const {
        const std::string escaped = "&lt;" + std::string(syn_.param_close.substr(1));
        std::string out;
        size_t pos = 0;
        for (size_t hit; (hit = raw.find(escaped, pos)) != std::string_view::npos;) {
            out.append(raw, pos, hit - pos);
            out += syn_.param_close;
            pos = hit + escaped.size();
        }
        out.append(raw, pos);
        return out;
    }

    std::string_view s_;
    size_t pos_;
    size_t end_;
    const Syntax &syn_;
};

// The earliest block start of any syntax in text, if any.
std::optional<std::pair<size_t, const Syntax *>> find_block_start(std::string_view text) {
    std::optional<std::pair<size_t, const Syntax *>> best;
    for (const Syntax &syn : kSyntaxes) {
        const size_t at = text.find(syn.calls_open);
        if (at != std::string_view::npos && (!best || at < best->first)) best = {at, &syn};
    }
    return best;
}

}  // namespace

ParsedMessage parse_generated_message(std::string_view text, bool thinking) {
    ParsedMessage msg;
    std::string_view rest = text;
    if (thinking) {
        std::string_view body = text;
        if (body.starts_with(kThinkOpenText)) body.remove_prefix(kThinkOpenText.size());
        const size_t close = body.rfind(kThinkCloseText);
        if (close == std::string_view::npos) {
            msg.reasoning = body;  // generation stopped while still reasoning
            return msg;
        }
        msg.reasoning = body.substr(0, close);
        rest = body.substr(close + kThinkCloseText.size());
    }

    const auto start = find_block_start(rest);
    if (!start) {
        msg.content = rest;
        return msg;
    }
    const auto [block_at, syntax] = *start;
    size_t content_end = block_at;
    while (content_end > 0 && is_space(rest[content_end - 1])) --content_end;
    const size_t body_begin = block_at + syntax->calls_open.size();
    const size_t close = rest.find(syntax->calls_close, body_begin);
    if (close == std::string_view::npos) {
        msg.status = DsmlStatus::kUnterminated;
        msg.error = fmt::format("unterminated tool call: {} at byte {} is never closed by {}",
                                syntax->calls_open, block_at, syntax->calls_close);
        msg.content = rest.substr(0, content_end);
        msg.raw_dsml = rest.substr(content_end);
        return msg;
    }
    try {
        msg.tool_calls = BlockParser(rest, body_begin, close, *syntax).parse();
    } catch (const ParseError &e) {
        msg.status = DsmlStatus::kMalformed;
        msg.error = fmt::format("malformed tool call block at byte {}: {}", e.at, e.what);
        msg.content = rest;
        return msg;
    }
    const size_t block_end = close + syntax->calls_close.size();
    msg.status = DsmlStatus::kComplete;
    msg.raw_dsml = rest.substr(content_end, block_end - content_end);
    msg.content = rest.substr(0, content_end);
    std::string_view after = rest.substr(block_end);
    while (!after.empty() && is_space(after.front())) after.remove_prefix(1);
    msg.content += after;
    return msg;
}

}  // namespace ds4::tokenizer

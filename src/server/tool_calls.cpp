#include "server/tool_calls.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "tokenizer/dsml_parser.h"
#include "tokenizer/dsml_render.h"

namespace ds4::server {

// The spellings tokenizer/dsml_parser.h accepts: what a block opens and closes with, and the
// invoke and parameter tags inside it.
struct ToolCallTracker::Syntax {
    std::string_view calls_open, calls_close, invoke_open, invoke_close, param_open, param_close;
};

namespace {

using ordered_json = nlohmann::ordered_json;
using tokenizer::ToolCall;

constexpr std::array<ToolCallTracker::Syntax, 3> kSyntaxes = {{
    {tokenizer::kDsmlToolCallsOpen, tokenizer::kDsmlToolCallsClose, tokenizer::kDsmlInvokeOpen,
     tokenizer::kDsmlInvokeClose, tokenizer::kDsmlParameterOpen, tokenizer::kDsmlParameterClose},
    {"<DSML｜tool_calls>", "</DSML｜tool_calls>", "<DSML｜invoke", "</DSML｜invoke>",
     "<DSML｜parameter", "</DSML｜parameter>"},
    {"<tool_calls>", "</tool_calls>", "<invoke", "</invoke>", "<parameter", "</parameter>"},
}};

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

size_t skip_space(std::string_view s) {
    size_t i = 0;
    while (i < s.size() && is_space(s[i])) ++i;
    return i;
}

// An attribute of an opening tag, read as tokenizer/dsml_parser.cpp reads it: the text between
// ` NAME="` and the next quote, with the five XML entities decoded.
std::optional<std::string> attribute(std::string_view tag, std::string_view name) {
    std::string needle(" ");
    needle += name;
    needle += "=\"";
    const size_t at = tag.find(needle);
    if (at == std::string_view::npos) return std::nullopt;
    const size_t begin = at + needle.size();
    const size_t end = tag.find('"', begin);
    if (end == std::string_view::npos) return std::nullopt;
    return tokenizer::unescape_attr(tag.substr(begin, end - begin));
}

// The inside of the JSON string of valid UTF-8 text: escaping is per character, so the pieces
// of a value escaped one by one concatenate to the value's JSON string.
std::string json_escaped(std::string_view text) {
    if (text.empty()) return "";
    const std::string quoted = ordered_json(std::string(text)).dump();
    return quoted.substr(1, quoted.size() - 2);
}

// The length of the UTF-8 character at the start of s (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF); 0 when s does not start with one, and then *pending when
// more bytes could still complete it. (The tokenizer's utf8.h says the same; the tracker keeps
// its own so that the request fuzzer links it without the tokenizer.)
size_t utf8_char(std::string_view s, bool *pending) {
    *pending = false;
    const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
    const unsigned char c = b(0);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;  // no overlong forms
        if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;  // no overlong forms
        if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; ++i) {
        if (i == s.size()) {
            *pending = true;
            return 0;
        }
        if (i == 1 ? b(1) < lo || b(1) > hi : (b(i) & 0xC0) != 0x80) return 0;
    }
    return n;
}

// The leading bytes of s that are whole valid UTF-8 characters; *pending when the rest is a
// character that later bytes may still complete.
size_t valid_prefix(std::string_view s, bool *pending) {
    *pending = false;
    for (size_t i = 0; i < s.size();) {
        const size_t n = utf8_char(s.substr(i), pending);
        if (n == 0) return i;
        i += n;
    }
    return s.size();
}

// The longest tail of s that is a proper prefix of tag (it may still become the tag).
size_t partial_tail(std::string_view s, std::string_view tag) {
    for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
        if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
    return 0;
}

}  // namespace

ToolOutput ToolCallTracker::push_silent(std::string_view text) {
    silent_in_buf_ += text.size();
    return push(text);
}

ToolOutput ToolCallTracker::push(std::string_view text) {
    buf_ += text;
    ToolOutput out;
    run(out);
    return out;
}

ToolOutput ToolCallTracker::finish() {
    ToolOutput out;
    run(out);
    switch (state_) {
        case State::Text:
        case State::Passthrough:
            out.content += take(buf_.size());
            break;
        case State::Block:
        case State::InvokeTag:
            bail(out);
            break;
        case State::Members:
        case State::ParamTag:
        case State::Body:
        case State::StringValue:
        case State::JsonValue:
            defect(out);  // the end of generation inside an invoke
            break;
        case State::Done:
            break;
    }
    return out;
}

std::string ToolCallTracker::take(size_t n) {
    const size_t silent = std::min(n, silent_in_buf_);
    std::string shown = buf_.substr(silent, n - silent);
    silent_in_buf_ -= silent;
    buf_.erase(0, n);
    return shown;
}

std::string ToolCallTracker::consume(size_t n) {
    std::string t = take(n);
    if (block_calls_ == 0) raw_ += t;
    return t;
}

void ToolCallTracker::run(ToolOutput &out) {
    for (bool more = true; more;) {
        switch (state_) {
            case State::Text:
                more = step_text(out);
                break;
            case State::Block:
                more = step_block(out);
                break;
            case State::InvokeTag:
                more = step_invoke_tag(out);
                break;
            case State::Members:
                more = step_members(out);
                break;
            case State::ParamTag:
                more = step_param_tag(out);
                break;
            case State::Body:
                more = step_body(out);
                break;
            case State::StringValue:
                more = step_string(out);
                break;
            case State::JsonValue:
                more = step_json(out);
                break;
            case State::Passthrough:
                out.content += take(buf_.size());
                more = false;
                break;
            case State::Done:
                take(buf_.size());  // text after the block is not part of the answer
                more = false;
                break;
        }
    }
}

bool ToolCallTracker::step_text(ToolOutput &out) {
    size_t best = std::string::npos;
    for (const Syntax &syn : kSyntaxes) {
        const size_t at = buf_.find(syn.calls_open);
        if (at < best) {
            best = at;
            syn_ = &syn;
        }
    }
    if (best != std::string::npos) {
        size_t end = best;
        while (end > 0 && is_space(buf_[end - 1])) --end;
        out.content += take(end);
        raw_ = take(best - end + syn_->calls_open.size());
        block_calls_ = 0;
        state_ = State::Block;
        return true;
    }
    // Hold the longest tail that may still grow into an opener, and the whitespace before it.
    size_t hold = 0;
    for (const Syntax &syn : kSyntaxes) hold = std::max(hold, partial_tail(buf_, syn.calls_open));
    size_t keep = buf_.size() - hold;
    while (keep > 0 && is_space(buf_[keep - 1])) --keep;
    out.content += take(keep);
    return false;
}

bool ToolCallTracker::step_block(ToolOutput &out) {
    const size_t i = skip_space(buf_);
    if (i == buf_.size()) return false;
    const std::string_view rest = std::string_view(buf_).substr(i);
    if (rest.starts_with(syn_->calls_close)) {
        consume(i + syn_->calls_close.size());
        state_ = State::Done;
        return true;
    }
    if (rest.starts_with(syn_->invoke_open)) {
        consume(i);
        scan_from_ = syn_->invoke_open.size();
        state_ = State::InvokeTag;
        return true;
    }
    if (syn_->calls_close.starts_with(rest) || syn_->invoke_open.starts_with(rest)) return false;
    bail(out);
    return true;
}

bool ToolCallTracker::step_invoke_tag(ToolOutput &out) {
    const size_t gt = buf_.find('>', scan_from_);
    if (gt == std::string::npos) {
        scan_from_ = buf_.size();
        return false;
    }
    const std::optional<std::string> name =
        attribute(std::string_view(buf_).substr(0, gt + 1), "name");
    if (!name || name->empty()) {
        bail(out);  // an invoke without a name is no call
        return true;
    }
    invoke_name_ = *name;
    started_ = false;
    frames_.assign(1, Frame{});
    consume(gt + 1);
    state_ = State::Members;
    return true;
}

bool ToolCallTracker::step_members(ToolOutput &out) {
    const size_t i = skip_space(buf_);
    if (i == buf_.size()) return false;
    const std::string_view rest = std::string_view(buf_).substr(i);
    const bool top = frames_.size() == 1;
    const std::string_view end = top ? syn_->invoke_close : syn_->param_close;
    if (rest.starts_with(end)) {
        consume(i + end.size());
        if (!started_) start_call(out);  // an invoke without parameters
        emit_args(out, "}");
        frames_.pop_back();
        if (top) {
            out.events.push_back({ToolEvent::Kind::End, calls_.size() - 1, "", true});
            started_ = false;
            state_ = State::Block;
        }
        return true;
    }
    if (rest.starts_with(syn_->param_open)) {
        consume(i);
        scan_from_ = syn_->param_open.size();
        state_ = State::ParamTag;
        return true;
    }
    if (syn_->param_open.starts_with(rest) || end.starts_with(rest)) return false;
    defect(out);
    return true;
}

bool ToolCallTracker::step_param_tag(ToolOutput &out) {
    const size_t gt = buf_.find('>', scan_from_);
    if (gt == std::string::npos) {
        scan_from_ = buf_.size();
        return false;
    }
    const std::string_view tag = std::string_view(buf_).substr(0, gt + 1);
    const std::optional<std::string> name = attribute(tag, "name");
    const std::optional<std::string> kind = attribute(tag, "string");
    Frame &f = frames_.back();
    if (!name || std::find(f.keys.begin(), f.keys.end(), *name) != f.keys.end()) {
        defect(out);  // no name, or a repeated one: its value has nowhere to go
        return true;
    }
    try {
        param_key_ = ordered_json(*name).dump();
    } catch (const std::exception &) {
        defect(out);  // a name that is not UTF-8
        return true;
    }
    f.keys.push_back(*name);
    consume(gt + 1);
    if (!started_) start_call(out);
    if (kind && *kind == "false") {
        scan_from_ = 0;
        state_ = State::JsonValue;
    } else if (kind) {
        emit_key(out);
        emit_args(out, "\"");
        state_ = State::StringValue;
    } else {
        state_ = State::Body;
    }
    return true;
}

bool ToolCallTracker::step_body(ToolOutput &out) {
    const size_t i = skip_space(buf_);
    if (i == buf_.size()) return false;
    const std::string_view rest = std::string_view(buf_).substr(i);
    if (rest.starts_with(syn_->param_open)) {  // loose XML: nested parameters are an object
        consume(i);
        emit_key(out);
        emit_args(out, "{");
        frames_.push_back(Frame{});
        state_ = State::Members;
        return true;
    }
    if (syn_->param_open.starts_with(rest)) return false;
    emit_key(out);  // a string, its leading whitespace included
    emit_args(out, "\"");
    state_ = State::StringValue;
    return true;
}

bool ToolCallTracker::step_string(ToolOutput &out) {
    const std::string_view close = syn_->param_close;
    std::string escape("&lt;");
    escape += close.substr(1);
    const std::string_view buf(buf_);
    std::string text;  // the value's text up to the closing tag or the held tail
    bool pending = false;
    for (size_t i = 0;;) {
        const size_t c = buf.find(close, i), e = buf.find(escape, i);
        if (e < c) {
            text.append(buf.substr(i, e - i));
            text += close;
            i = e + escape.size();
            continue;
        }
        if (c != std::string_view::npos) {
            text.append(buf.substr(i, c - i));
            const size_t ok = valid_prefix(text, &pending);
            emit_args(out, json_escaped(std::string_view(text).substr(0, ok)));
            if (ok < text.size()) {
                defect(out);  // invalid UTF-8 in the value
                return true;
            }
            consume(c + close.size());
            emit_args(out, "\"");
            state_ = State::Members;
            return true;
        }
        // No closing tag yet: a tail that may still become one (or its escape) waits.
        const std::string_view rest = buf.substr(i);
        const size_t hold = std::max(partial_tail(rest, close), partial_tail(rest, escape));
        const size_t end = buf.size() - hold;
        text.append(buf.substr(i, end - i));
        const size_t ok = valid_prefix(text, &pending);
        emit_args(out, json_escaped(std::string_view(text).substr(0, ok)));
        if (ok < text.size() && !(pending && hold == 0)) {
            defect(out);  // invalid UTF-8 in the value
            return true;
        }
        consume(end - (text.size() - ok));  // an unfinished character waits too
        return false;
    }
}

bool ToolCallTracker::step_json(ToolOutput &out) {
    const std::string_view close = syn_->param_close;
    const size_t c = buf_.find(close, scan_from_);
    if (c == std::string::npos) {
        scan_from_ = buf_.size() >= close.size() ? buf_.size() - close.size() + 1 : 0;
        return false;
    }
    std::string value;
    try {
        value = tokenizer::parameter_json_value(std::string_view(buf_).substr(0, c)).dump();
    } catch (const std::exception &) {
        defect(out);  // invalid UTF-8 in the value
        return true;
    }
    consume(c + close.size());
    emit_key(out);
    emit_args(out, value);
    state_ = State::Members;
    return true;
}

void ToolCallTracker::bail(ToolOutput &out) {
    std::string tail = raw_ + take(buf_.size());
    raw_.clear();
    frames_.clear();
    started_ = false;
    if (block_calls_ > 0) {
        state_ = State::Done;
        return;
    }
    out.content += tail;
    state_ = State::Passthrough;
}

void ToolCallTracker::defect(ToolOutput &out) {
    if (!started_) {
        bail(out);
        return;
    }
    if (state_ == State::StringValue) emit_args(out, "\"");
    for (size_t n = frames_.size(); n > 0; --n) emit_args(out, "}");
    frames_.clear();
    out.events.push_back({ToolEvent::Kind::End, calls_.size() - 1, "", false});
    started_ = false;
    cut_ = true;
    take(buf_.size());
    state_ = State::Done;
}

void ToolCallTracker::start_call(ToolOutput &out) {
    out.events.push_back({ToolEvent::Kind::Start, calls_.size(), invoke_name_});
    calls_.push_back({"", invoke_name_, ""});
    started_ = true;
    ++block_calls_;
    raw_.clear();
    emit_args(out, "{");
}

void ToolCallTracker::emit_args(ToolOutput &out, std::string_view piece) {
    if (piece.empty()) return;
    const size_t index = calls_.size() - 1;
    calls_.back().arguments += piece;
    if (!out.events.empty() && out.events.back().kind == ToolEvent::Kind::Arguments &&
        out.events.back().index == index)
        out.events.back().text += piece;
    else
        out.events.push_back({ToolEvent::Kind::Arguments, index, std::string(piece)});
}

void ToolCallTracker::emit_key(ToolOutput &out) {
    Frame &f = frames_.back();
    std::string piece(f.any ? "," : "");
    piece += param_key_;
    piece += ':';
    f.any = true;
    emit_args(out, piece);
}

std::string forced_tool_prefix(ToolChoice choice, const std::string &name) {
    if (choice != ToolChoice::Required && choice != ToolChoice::Named) return "";
    // The canonical rendering of a call to `name`, cut after the line the model must continue.
    const std::vector<ToolCall> call{{"", choice == ToolChoice::Named ? name : "x", "{}"}};
    const std::string dsml = tokenizer::render_tool_calls_dsml(call);
    const size_t open = dsml.find(tokenizer::kDsmlToolCallsOpen);
    const size_t line = choice == ToolChoice::Named
                            ? dsml.find('\n', dsml.find(tokenizer::kDsmlInvokeOpen))
                            : dsml.find('\n', open);
    return dsml.substr(0, line + 1);
}

std::string make_tool_id(std::string_view prefix) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::random_device rd;
    std::string id(prefix);
    for (int i = 0; i < 4; ++i) {
        const uint32_t r = rd();
        for (int b = 0; b < 8; ++b) id += kHex[(r >> (4 * b)) & 15];
    }
    return id;
}

}  // namespace ds4::server

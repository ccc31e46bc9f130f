#include "server/tool_calls.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <random>

#include "tokenizer/dsml_parser.h"
#include "tokenizer/dsml_render.h"

namespace ds4::server {

// The spellings tokenizer/dsml_parser.h accepts: what a block opens and closes with, and the
// invoke tags inside it.
struct ToolCallTracker::Syntax {
    std::string_view calls_open, calls_close, invoke_open, invoke_close;
};

namespace {

using ordered_json = nlohmann::ordered_json;
using tokenizer::ToolCall;

constexpr std::array<ToolCallTracker::Syntax, 3> kSyntaxes = {{
    {tokenizer::kDsmlToolCallsOpen, tokenizer::kDsmlToolCallsClose, tokenizer::kDsmlInvokeOpen,
     tokenizer::kDsmlInvokeClose},
    {"<DSML｜tool_calls>", "</DSML｜tool_calls>", "<DSML｜invoke", "</DSML｜invoke>"},
    {"<tool_calls>", "</tool_calls>", "<invoke", "</invoke>"},
}};

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// The calls of one invoke text (opening tag to closing tag), parsed by the tokenizer's parser as
// a block of its own; nothing when it does not parse.
std::vector<ToolCall> parse_invoke(const ToolCallTracker::Syntax &syn, std::string_view invoke) {
    std::string block(syn.calls_open);
    block += invoke;
    block += syn.calls_close;
    try {
        tokenizer::ParsedMessage p = tokenizer::parse_generated_message(block, false);
        if (p.status == tokenizer::DsmlStatus::kComplete && p.content.empty())
            return std::move(p.tool_calls);
    } catch (const std::exception &) {
        // Text the JSON layer refuses (invalid UTF-8 in a value): not a call.
    }
    return {};
}

// "{" + first member, "," + each next one, "}": the arguments object, piece by piece.
std::vector<std::string> argument_pieces(const std::string &arguments) {
    const ordered_json args = ordered_json::parse(arguments);
    if (!args.is_object() || args.empty()) return {arguments};
    std::vector<std::string> out;
    for (auto it = args.begin(); it != args.end(); ++it) {
        std::string piece(out.empty() ? "{" : ",");
        piece += ordered_json(it.key()).dump();
        piece += ':';
        piece += it.value().dump();
        out.push_back(std::move(piece));
    }
    out.push_back("}");
    return out;
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
    if (state_ == State::Text || state_ == State::Passthrough) {
        out.content += take(buf_.size());
    } else if (state_ == State::Block || state_ == State::Invoke) {
        bail(out);
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

void ToolCallTracker::run(ToolOutput &out) {
    for (bool more = true; more;) {
        switch (state_) {
            case State::Text:
                more = step_text(out);
                break;
            case State::Block:
                more = step_block(out);
                break;
            case State::Invoke:
                more = step_invoke(out);
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
    for (const Syntax &syn : kSyntaxes) {
        for (size_t n = std::min(buf_.size(), syn.calls_open.size() - 1); n > hold; --n) {
            if (std::string_view(buf_).substr(buf_.size() - n) == syn.calls_open.substr(0, n)) {
                hold = n;
                break;
            }
        }
    }
    size_t keep = buf_.size() - hold;
    while (keep > 0 && is_space(buf_[keep - 1])) --keep;
    out.content += take(keep);
    return false;
}

bool ToolCallTracker::step_block(ToolOutput &out) {
    size_t i = 0;
    while (i < buf_.size() && is_space(buf_[i])) ++i;
    if (i == buf_.size()) return false;
    const std::string_view rest = std::string_view(buf_).substr(i);
    if (rest.starts_with(syn_->calls_close)) {
        raw_ += take(i + syn_->calls_close.size());
        state_ = State::Done;
        return true;
    }
    if (rest.starts_with(syn_->invoke_open)) {
        raw_ += take(i);
        search_from_ = 0;
        state_ = State::Invoke;
        return true;
    }
    if (syn_->calls_close.starts_with(rest) || syn_->invoke_open.starts_with(rest)) return false;
    bail(out);
    return true;
}

bool ToolCallTracker::step_invoke(ToolOutput &out) {
    const std::string_view close = syn_->invoke_close;
    const size_t scanned = search_from_;
    for (size_t at; (at = buf_.find(close, search_from_)) != std::string::npos;) {
        const size_t end = at + close.size();
        const std::vector<ToolCall> calls =
            parse_invoke(*syn_, std::string_view(buf_).substr(0, end));
        if (calls.empty()) {
            search_from_ = end;  // the tag was inside a value, or the invoke is malformed
            continue;
        }
        for (const ToolCall &c : calls) emit_call(c, out);
        raw_ += take(end);
        state_ = State::Block;
        return true;
    }
    // The block closed around an invoke that never parsed.
    const size_t from =
        scanned >= syn_->calls_close.size() ? scanned - syn_->calls_close.size() : 0;
    if (buf_.find(syn_->calls_close, from) != std::string::npos) {
        bail(out);
        return true;
    }
    search_from_ =
        std::max(search_from_, buf_.size() >= close.size() ? buf_.size() - close.size() + 1 : 0);
    return false;
}

void ToolCallTracker::bail(ToolOutput &out) {
    std::string tail = raw_ + take(buf_.size());
    raw_.clear();
    if (block_calls_ > 0) {
        state_ = State::Done;
        return;
    }
    out.content += tail;
    state_ = State::Passthrough;
}

void ToolCallTracker::emit_call(const ToolCall &call, ToolOutput &out) {
    const size_t index = calls_.size();
    out.events.push_back({ToolEvent::Kind::Start, index, call.name});
    for (std::string &piece : argument_pieces(call.arguments))
        out.events.push_back({ToolEvent::Kind::Arguments, index, std::move(piece)});
    out.events.push_back({ToolEvent::Kind::End, index, ""});
    calls_.push_back(call);
    ++block_calls_;
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

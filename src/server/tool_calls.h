#pragma once
// Tool calls in a generated answer, found while it streams (docs/SERVER.md, Tool calls).
//
// The model writes calls as one DSML block after its content (docs/SURFACES.md 3.6-3.7, the
// format of DeepSeek's encoding_dsv4.py):
//
//   content\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter ...>...
//   </｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>
//
// ToolCallTracker takes the content text piece by piece. Outside a block it passes text on, except
// a tail that may still become a block opener (any of the three spellings the tokenizer's parser
// accepts) and the whitespace before it, which is held until the next piece settles it. Inside a
// block nothing is shown as content. Each invoke is parsed as it comes (the grammar of
// tokenizer/dsml_parser.h, incrementally): once its tag and the first parameter's tag (or its
// closing tag) are complete, a Start event gives the call's name, and the arguments JSON follows
// in Arguments pieces as it is written: "{" at once, then per parameter its key, and a string
// value's text as it comes (a tail that may still become the closing tag or its `&lt;` escape,
// or an unfinished UTF-8 character, waits for the next piece), a JSON value (string="false")
// whole when its closing tag has come, a nested object member by member, "}" and an End event at
// the invoke's closing tag. The pieces of a call concatenate to its arguments in calls(): the
// compact JSON the non-streamed answer gives.
//
// Defects: a block whose first invoke breaks before its Start (text that is neither an invoke nor
// the closing tag, an invoke without a name, a first parameter without a name) ends the block,
// and its text is returned as content (the markup is then visible: that is the fallback). After
// a Start a call is never taken back: when its invoke breaks (text that is no parameter, a
// parameter without a name or whose name repeats, invalid UTF-8 in a value, the end of
// generation before the closing tag), it is closed where it broke -- an open string value ended
// as written (a held tail dropped), a JSON value not yet closed left out, the open objects closed
// -- with an End whose `complete` is false, cut() is true and the rest of the answer is dropped.
// Text in a block after complete calls that is neither an invoke nor the closing tag ends the
// block too, the calls standing. A parameter declared string="false" whose body is not JSON is
// passed on as a JSON string holding the raw body, so arguments are always a valid JSON object.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tool_call.h"

namespace ds4::server {

struct ToolEvent {
    enum class Kind { Start, Arguments, End };
    Kind kind;
    size_t index;          // of the call in the answer, from 0
    std::string text;      // Start: the name; Arguments: a piece of the arguments JSON
    bool complete = true;  // End: false when the call was closed where its invoke broke
};

// What a piece of text turned into: content to show now, and call events.
struct ToolOutput {
    std::string content;
    std::vector<ToolEvent> events;
};

class ToolCallTracker {
  public:
    // Text that starts the answer but is not generated (a prefill, a forced tool_choice prefix):
    // it moves the state and may complete calls, but its content is not shown again.
    ToolOutput push_silent(std::string_view text);
    ToolOutput push(std::string_view text);
    // The end of generation: held text released, an unfinished block resolved as above.
    ToolOutput finish();

    // The block closed, or broke after a call started: the answer is over.
    bool done() const { return state_ == State::Done; }
    // The calls started, their arguments as streamed so far (closed once End was emitted).
    const std::vector<tokenizer::ToolCall> &calls() const { return calls_; }
    // The last call was closed where its invoke broke, before its closing tag.
    bool cut() const { return cut_; }

    struct Syntax;  // one spelling of the block's tags

  private:
    enum class State {
        Text,         // before a block
        Block,        // in a block, between invokes
        InvokeTag,    // at an invoke's opening tag, waiting for its '>'
        Members,      // in an invoke or a nested object, between parameters
        ParamTag,     // at a parameter's opening tag, waiting for its '>'
        Body,         // a parameter without a string attribute: a string or a nested object?
        StringValue,  // in a string value
        JsonValue,    // in a string="false" value
        Done,
        Passthrough,  // a broken block given back as text: the rest is text too
    };
    struct Frame {  // an object being written: the invoke's arguments or a nested parameter
        std::vector<std::string> keys;  // its parameters' names so far
        bool any = false;               // a member was written
    };

    void run(ToolOutput &out);
    bool step_text(ToolOutput &out);
    bool step_block(ToolOutput &out);
    bool step_invoke_tag(ToolOutput &out);
    bool step_members(ToolOutput &out);
    bool step_param_tag(ToolOutput &out);
    bool step_body(ToolOutput &out);
    bool step_string(ToolOutput &out);
    bool step_json(ToolOutput &out);
    // The block breaks: its text becomes content when no call of it started, else it ends.
    void bail(ToolOutput &out);
    // The invoke breaks: bail() before its Start, else the call is closed where it is (cut).
    void defect(ToolOutput &out);
    void start_call(ToolOutput &out);
    void emit_args(ToolOutput &out, std::string_view piece);
    // The member's key: `"key":` after a comma unless it is the object's first.
    void emit_key(ToolOutput &out);
    // The first n bytes of buf_, removed; returns those of them that were generated, and keeps
    // them in raw_ while the block may still turn out to be text.
    std::string take(size_t n);
    std::string consume(size_t n);  // take(n), appended to raw_ while it matters

    State state_ = State::Text;
    const Syntax *syn_ = nullptr;
    std::string buf_;           // text not yet consumed
    std::string raw_;           // generated text of the current block, until a call of it starts
    size_t block_calls_ = 0;    // calls started in the current block
    size_t scan_from_ = 0;      // where in buf_ the search for a '>' or a closing tag goes on
    size_t silent_in_buf_ = 0;  // leading bytes of buf_ that were pushed silently
    bool started_ = false;      // the current invoke's Start was emitted
    bool cut_ = false;
    std::string invoke_name_;    // of the current invoke, until its Start
    std::string param_key_;      // of the parameter being read
    std::vector<Frame> frames_;  // the objects open in the current invoke, outermost first
    std::vector<tokenizer::ToolCall> calls_;
};

enum class ToolChoice { Auto, None, Required, Named };

// The text the assistant turn is made to start with, so that the model can only continue a call:
// the block opener for Required, the opener and `<｜DSML｜invoke name="NAME">\n` for Named, nothing
// otherwise. The template has no other way to force a call.
std::string forced_tool_prefix(ToolChoice choice, const std::string &name);

// prefix + 32 random hex digits (call_..., toolu_...), as the reference server makes them.
std::string make_tool_id(std::string_view prefix);

}  // namespace ds4::server

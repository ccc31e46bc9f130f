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
// block nothing is shown as content. Each invoke is released whole, once its closing tag has come
// and it parses (tokenizer::parse_generated_message is the parser): a Start event (the name), one
// Arguments event per top-level member of the arguments object ("{" + member, "," + member, ...,
// "}"; "{}" alone for none), an End event. So a client only ever sees complete calls, and the
// pieces of a call concatenate to the arguments JSON of the non-streamed answer.
//
// Defects: text in a block that is neither an invoke nor the closing tag, or a block that never
// closes, ends the block. When no call of the block was complete, the block's text is returned as
// content (the markup is then visible: that is the fallback). When some were, they stand and the
// rest is dropped. A parameter declared string="false" whose body is not JSON is passed on as a
// JSON string holding the raw body, so arguments are always a valid JSON object.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tool_call.h"

namespace ds4::server {

struct ToolEvent {
    enum class Kind { Start, Arguments, End };
    Kind kind;
    size_t index;      // of the call in the answer, from 0
    std::string text;  // Start: the name; Arguments: a piece of the arguments JSON
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

    // The block closed, or broke after complete calls: the answer is over.
    bool done() const { return state_ == State::Done; }
    const std::vector<tokenizer::ToolCall> &calls() const { return calls_; }

    struct Syntax;  // one spelling of the block's tags

  private:
    enum class State { Text, Block, Invoke, Done, Passthrough };

    void run(ToolOutput &out);
    bool step_text(ToolOutput &out);
    bool step_block(ToolOutput &out);
    bool step_invoke(ToolOutput &out);
    void bail(ToolOutput &out);
    void emit_call(const tokenizer::ToolCall &call, ToolOutput &out);
    // The first n bytes of buf_, removed; returns those of them that were generated.
    std::string take(size_t n);

    State state_ = State::Text;
    const Syntax *syn_ = nullptr;
    std::string buf_;           // text not yet consumed
    std::string raw_;           // generated text of the current block since its start
    size_t block_calls_ = 0;    // calls completed in the current block
    size_t search_from_ = 0;    // where in buf_ the next invoke-close search starts
    size_t silent_in_buf_ = 0;  // leading bytes of buf_ that were pushed silently
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

#pragma once
// A tool call opened inside an unclosed think block (docs/SERVER.md, Tool calls).
//
// The model is to close its reasoning with </think> before it writes a DSML tool-call block, but
// it sometimes opens the block while still thinking. Left alone, the call would be shown as
// reasoning text and never run. ThinkToolGate watches the reasoning text of a request with tools
// for the DSML block opener (<｜DSML｜tool_calls>, the spelling with the full-width bars only: the
// plain spellings are ordinary words a model may reason about). From the opener on, the text is
// not reasoning: the think block is taken as closed there, and the opener and what follows go to
// the tool-call tracker as content. A tail that may still grow into the opener is held until the
// next piece settles it.
#include <string>
#include <string_view>

namespace ds4::server {

class ThinkToolGate {
  public:
    struct Output {
        std::string reasoning;  // reasoning text to show now
        bool opened = false;    // the opener came: the think block ends before it
        std::string rest;       // with opened: the opener and the text after it
    };
    // A piece of reasoning text. After an opener the gate is spent: call it no more.
    Output push(std::string_view text);
    // The end of the think block (</think>, or the end of generation): the held tail.
    std::string flush();

  private:
    std::string held_;
};

}  // namespace ds4::server

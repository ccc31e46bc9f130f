#pragma once
// Turns generated token ids into the CLI's stdout text (docs/SURFACES.md 2.4): UTF-8 safe across
// tokens, <think>/</think> and EOS not printed, reasoning in grey on a terminal, a newline after
// the reasoning when it did not end with one.
#include <cstdint>
#include <string>

#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace ds4::cli {

class TextPrinter {
  public:
    // in_reasoning: the prompt ended with <think>, so generation starts inside the reasoning.
    TextPrinter(const tokenizer::Tokenizer &tok, bool in_reasoning, bool color);
    void push(int32_t id);
    // Flushes what is held and ends the output with a newline.
    void finish();

  private:
    void write(const std::string &s);
    const tokenizer::Tokenizer &tok_;
    tokenizer::StreamDecoder decoder_;
    bool reasoning_, color_;
    char last_ = '\n';
};

}  // namespace ds4::cli

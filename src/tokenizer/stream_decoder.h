#pragma once
// Incremental decoding for streaming: token bytes in, text out that never ends inside a
// UTF-8 character.
//
// A token can end in the middle of a multi-byte character (byte-level BPE splits emoji and CJK
// freely). push() returns the bytes that end on a character boundary and keeps a trailing
// incomplete sequence until the next token completes it. Bytes that can never become part of
// a character (invalid UTF-8) are passed through as they come rather than held. So the
// concatenation of everything push() and flush() return is exactly decode(ids).
#include <cstdint>
#include <string>

namespace ds4::tokenizer {

class Tokenizer;

class StreamDecoder {
  public:
    explicit StreamDecoder(const Tokenizer &tokenizer) : tokenizer_(tokenizer) {}

    std::string push(int32_t id);
    // Whatever is still held (an incomplete sequence at the end of the stream); resets.
    std::string flush();
    bool has_pending() const { return !pending_.empty(); }

  private:
    const Tokenizer &tokenizer_;
    std::string pending_;
};

}  // namespace ds4::tokenizer

#pragma once
// The vocabulary data a tokenizer is built from, and how it is read from a GGUF file.
//
// GGUF keys (llama.cpp conventions): tokenizer.ggml.tokens (id -> string), tokenizer.ggml.merges
// ("A B", rank = index), tokenizer.ggml.token_type (optional, TokenType values),
// tokenizer.ggml.model (must be "gpt2" when present) and tokenizer.ggml.pre (when present, one
// of the names of the DeepSeek V3/V4 pre-tokenizer, which is the only one implemented).
#include <cstdint>
#include <string>
#include <vector>

namespace ds4::gguf {
class File;
}

namespace ds4::tokenizer {

// llama.cpp's token types (gguf-py TokenType).
enum class TokenType : int32_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,      // special tokens: BOS, EOS, <｜User｜>, ...
    kUserDefined = 4,  // added tokens that are not special: <think>, ｜DSML｜, ...
    kUnused = 5,
    kByte = 6,
};

struct Vocabulary {
    std::vector<std::string> tokens;  // id -> token string (byte-level spelling or literal)
    std::vector<std::string> merges;  // "A B", rank = index
    std::vector<int32_t> types;       // id -> TokenType value; empty means all normal
};

// Reads and checks the tokenizer keys of a GGUF; throws ds4::Error naming the file and key.
Vocabulary load_vocabulary(const gguf::File &file);

}  // namespace ds4::tokenizer

#pragma once
// DeepSeek V4 tokenizer: byte-level BPE with the V3/V4 pre-tokenizer, the chat special tokens,
// and decoding to bytes.
//
// `encode` treats its input as plain text (the way the reference engine tokenizes a prompt, a
// system text or a user message in its CLI): special-token strings are ordinary text there.
// `encode_chat_text` is for rendered transcripts: the seven chat specials (special_tokens.h)
// become their ids and the text between them is encoded as by `encode`, each stretch on its own.
// Any byte string is accepted; invalid UTF-8 bytes become their single-byte tokens (see
// pre_tokenizer.h), so decode(encode(s)) == s for every s.
//
// A Tokenizer is immutable after construction and safe to use from many threads at once.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/vocabulary.h"

namespace ds4::tokenizer {

class Tokenizer {
  public:
    // Throws ds4::Error when the merges do not fit the tokens or a chat special is missing
    // (a DeepSeek V3 vocabulary lacks <think>, </think> and ｜DSML｜).
    explicit Tokenizer(Vocabulary vocab);

    // Loads the vocabulary of a GGUF file (a model or a vocab-only file).
    static Tokenizer from_gguf(const std::string &path);

    std::vector<int32_t> encode(std::string_view text) const;
    void encode_append(std::string_view text, std::vector<int32_t> &out) const;

    std::vector<int32_t> encode_chat_text(std::string_view text) const;
    void encode_chat_text_append(std::string_view text, std::vector<int32_t> &out) const;

    // Bytes of the tokens, concatenated. Throws ds4::Error for an id out of range.
    std::string decode(std::span<const int32_t> ids) const;
    // Bytes one token stands for: byte-level tokens map back through the byte alphabet,
    // special and added tokens are their literal UTF-8 text.
    std::string_view token_bytes(int32_t id) const;
    // The vocabulary string of a token.
    const std::string &token_text(int32_t id) const;
    std::optional<int32_t> find_token(std::string_view text) const;
    TokenType token_type(int32_t id) const;

    size_t n_tokens() const { return vocab_.tokens.size(); }
    size_t n_merges() const { return bpe_.n_merges(); }
    const ChatSpecialIds &specials() const { return specials_; }

  private:
    void check_id(int32_t id) const;

    Vocabulary vocab_;
    std::unordered_map<std::string, int32_t> ids_;
    BpeMerges bpe_;
    ChatSpecialIds specials_;
    std::string decoded_;                // token bytes of every id, back to back
    std::vector<uint32_t> decoded_end_;  // id -> end offset in decoded_
};

}  // namespace ds4::tokenizer

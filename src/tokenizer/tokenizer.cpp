#include "tokenizer/tokenizer.h"

#include <fmt/format.h>

#include <cstring>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"

namespace ds4::tokenizer {
namespace {

std::unordered_map<std::string, int32_t> index_tokens(const Vocabulary &vocab) {
    if (!vocab.types.empty() && vocab.types.size() != vocab.tokens.size()) {
        throw Error(fmt::format("tokenizer: {} token types for {} tokens", vocab.types.size(),
                                vocab.tokens.size()));
    }
    std::unordered_map<std::string, int32_t> ids;
    ids.reserve(vocab.tokens.size());
    for (size_t i = 0; i < vocab.tokens.size(); ++i) {
        // The first id wins for a string listed twice (only placeholders could be).
        ids.emplace(vocab.tokens[i], static_cast<int32_t>(i));
    }
    return ids;
}

// The chat special whose text starts at text[pos], if any.
const ChatSpecial *special_at(std::string_view text, size_t pos) {
    for (const ChatSpecial &s : kChatSpecials) {
        if (text.compare(pos, s.text.size(), s.text) == 0) return &s;
    }
    return nullptr;
}

}  // namespace

Tokenizer::Tokenizer(Vocabulary vocab)
    : vocab_(std::move(vocab)), ids_(index_tokens(vocab_)), bpe_(ids_, vocab_.merges) {
    std::string missing;
    for (const ChatSpecial &s : kChatSpecials) {
        auto it = ids_.find(std::string(s.text));
        if (it == ids_.end()) {
            missing += missing.empty() ? "" : ", ";
            missing += s.text;
        } else {
            specials_.*s.id = it->second;
        }
    }
    if (!missing.empty()) {
        throw Error(
            fmt::format("tokenizer: the vocabulary lacks the chat special tokens {} "
                        "(a DeepSeek V3 vocabulary? V4 is needed)",
                        missing));
    }

    decoded_end_.reserve(vocab_.tokens.size());
    for (size_t id = 0; id < vocab_.tokens.size(); ++id) {
        const std::string &text = vocab_.tokens[id];
        const auto type = token_type(static_cast<int32_t>(id));
        std::optional<std::string> bytes;
        if (type != TokenType::kControl && type != TokenType::kUserDefined) {
            bytes = byte_level_decode(text);
        }
        decoded_ += bytes ? *bytes : text;
        decoded_end_.push_back(static_cast<uint32_t>(decoded_.size()));
    }
}

Tokenizer Tokenizer::from_gguf(const std::string &path) {
    auto file = gguf::File::open(path);
    try {
        return Tokenizer(load_vocabulary(*file));
    } catch (const Error &e) {
        throw Error(fmt::format("{}: {}", path, e.what()));
    }
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t> &out) const {
    std::vector<std::string_view> pieces;
    pre_tokenize(text, pieces);
    BpeWorkspace ws;
    for (std::string_view piece : pieces) bpe_.encode_piece(piece, out, ws);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 1);
    encode_append(text, out);
    return out;
}

void Tokenizer::encode_chat_text_append(std::string_view text, std::vector<int32_t> &out) const {
    size_t start = 0;
    size_t pos = 0;
    while (pos < text.size()) {
        // Every special starts with '<' or with the first byte of '｜' (EF BD 9C).
        const char c = text[pos];
        const ChatSpecial *s = (c == '<' || c == '\xEF') ? special_at(text, pos) : nullptr;
        if (s == nullptr) {
            ++pos;
            continue;
        }
        if (start < pos) encode_append(text.substr(start, pos - start), out);
        out.push_back(specials_.*s->id);
        pos += s->text.size();
        start = pos;
    }
    if (start < text.size()) encode_append(text.substr(start), out);
}

std::vector<int32_t> Tokenizer::encode_chat_text(std::string_view text) const {
    std::vector<int32_t> out;
    encode_chat_text_append(text, out);
    return out;
}

void Tokenizer::check_id(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= vocab_.tokens.size()) {
        throw Error(fmt::format("tokenizer: token id {} is out of range [0, {})", id,
                                vocab_.tokens.size()));
    }
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
    check_id(id);
    const uint32_t begin = id == 0 ? 0 : decoded_end_[id - 1];
    return std::string_view(decoded_).substr(begin, decoded_end_[id] - begin);
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
    std::string out;
    for (int32_t id : ids) out += token_bytes(id);
    return out;
}

const std::string &Tokenizer::token_text(int32_t id) const {
    check_id(id);
    return vocab_.tokens[id];
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
    auto it = ids_.find(std::string(text));
    if (it == ids_.end()) return std::nullopt;
    return it->second;
}

TokenType Tokenizer::token_type(int32_t id) const {
    check_id(id);
    return vocab_.types.empty() ? TokenType::kNormal : static_cast<TokenType>(vocab_.types[id]);
}

}  // namespace ds4::tokenizer

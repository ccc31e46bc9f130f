#pragma once
// Shared helpers for the tokenizer tests: fixture paths, the committed V4 vocabulary loaded once,
// and the reader of corpus.bin (format in scripts/tokenizer_fixtures.py).
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ds4::tokenizer::testing {

inline std::string source_path(const std::string &relative) {
    return std::string(DS4_SOURCE_DIR) + "/" + relative;
}

inline std::string fixture_path(const std::string &name) {
    return source_path("tests/tokenizer/fixtures/" + name);
}

inline std::string read_bytes(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// models/ds4-vocab.gguf, built by scripts/make_vocab_gguf.py from the V4 tokenizer.json.
inline const Tokenizer &v4_tokenizer() {
    static const Tokenizer tok = Tokenizer::from_gguf(source_path("models/ds4-vocab.gguf"));
    return tok;
}

struct CorpusCase {
    bool chat = false;  // encode_chat_text instead of encode
    std::string text;
    std::vector<int32_t> ids;  // HF tokenizers' answer
};

inline std::vector<CorpusCase> load_corpus() {
    const std::string data = read_bytes(fixture_path("corpus.bin"));
    size_t pos = 0;
    auto need = [&](size_t n) {
        if (data.size() - pos < n) throw std::runtime_error("corpus.bin is truncated");
    };
    auto u32 = [&] {
        need(4);
        uint32_t v;
        std::memcpy(&v, data.data() + pos, 4);
        pos += 4;
        return v;
    };
    need(8);
    if (data.compare(0, 8, "DS4TOKC2") != 0) {
        throw std::runtime_error(
            "corpus.bin: bad magic; regenerate with scripts/tokenizer_fixtures.py");
    }
    pos = 8;
    std::vector<CorpusCase> cases(u32());
    for (CorpusCase &c : cases) {
        need(1);
        c.chat = data[pos++] == 1;
        const uint32_t len = u32();
        need(len);
        c.text = data.substr(pos, len);
        pos += len;
        c.ids.resize(u32());
        for (int32_t &id : c.ids) {
            uint32_t v = 0;
            for (int shift = 0;; shift += 7) {
                need(1);
                const auto byte = static_cast<uint8_t>(data[pos++]);
                v |= uint32_t{byte & 0x7Fu} << shift;
                if (!(byte & 0x80)) break;
            }
            id = static_cast<int32_t>(v);
        }
    }
    return cases;
}

inline std::string hex(std::string_view s) {
    static const char *digits = "0123456789abcdef";
    std::string out;
    for (char c : s) {
        out += digits[static_cast<uint8_t>(c) >> 4];
        out += digits[static_cast<uint8_t>(c) & 15];
    }
    return out;
}

}  // namespace ds4::tokenizer::testing

#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace ds4::tokenizer {
namespace {

bool maps_to_itself(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

struct ByteMap {
    std::array<char32_t, 256> to_cp{};
    std::array<int16_t, 324> to_byte{};  // code points 0..323 cover the whole alphabet

    ByteMap() {
        to_byte.fill(-1);
        char32_t next = 256;
        for (unsigned b = 0; b < 256; ++b) {
            to_cp[b] = maps_to_itself(b) ? b : next++;
            to_byte[to_cp[b]] = static_cast<int16_t>(b);
        }
    }
};

const ByteMap &byte_map() {
    static const ByteMap map;
    return map;
}

}  // namespace

char32_t byte_to_code_point(uint8_t byte) {
    return byte_map().to_cp[byte];
}

std::optional<uint8_t> code_point_to_byte(char32_t cp) {
    const ByteMap &m = byte_map();
    if (cp >= m.to_byte.size() || m.to_byte[cp] < 0) return std::nullopt;
    return static_cast<uint8_t>(m.to_byte[cp]);
}

std::string byte_level_encode(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) utf8_append(out, byte_to_code_point(static_cast<uint8_t>(c)));
    return out;
}

std::optional<std::string> byte_level_decode(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    char32_t cp = 0;
    while (!text.empty()) {
        const size_t n = utf8_decode(text, &cp);
        if (n == 0) return std::nullopt;
        const auto byte = code_point_to_byte(cp);
        if (!byte) return std::nullopt;
        out.push_back(static_cast<char>(*byte));
        text.remove_prefix(n);
    }
    return out;
}

}  // namespace ds4::tokenizer

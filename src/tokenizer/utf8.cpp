#include "tokenizer/utf8.h"

namespace ds4::tokenizer {
namespace {

// For a lead byte: the sequence length and the allowed range of the second byte (which encodes
// the overlong, surrogate and > U+10FFFF exclusions, Unicode Table 3-7).
struct LeadInfo {
    uint8_t length;  // 0: not a lead byte
    uint8_t second_lo;
    uint8_t second_hi;
};

LeadInfo lead_info(uint8_t b) {
    if (b < 0x80) return {1, 0, 0};
    if (b < 0xC2) return {0, 0, 0};  // continuation byte or overlong 2-byte lead
    if (b < 0xE0) return {2, 0x80, 0xBF};
    if (b == 0xE0) return {3, 0xA0, 0xBF};
    if (b == 0xED) return {3, 0x80, 0x9F};  // excludes surrogates U+D800..DFFF
    if (b < 0xF0) return {3, 0x80, 0xBF};
    if (b == 0xF0) return {4, 0x90, 0xBF};
    if (b < 0xF4) return {4, 0x80, 0xBF};
    if (b == 0xF4) return {4, 0x80, 0x8F};  // up to U+10FFFF
    return {0, 0, 0};
}

bool is_continuation(uint8_t b) {
    return (b & 0xC0) == 0x80;
}

}  // namespace

size_t utf8_decode(std::string_view s, char32_t *cp) {
    if (s.empty()) return 0;
    const auto *p = reinterpret_cast<const uint8_t *>(s.data());
    const LeadInfo info = lead_info(p[0]);
    if (info.length == 0 || info.length > s.size()) return 0;
    if (info.length == 1) {
        *cp = p[0];
        return 1;
    }
    if (p[1] < info.second_lo || p[1] > info.second_hi) return 0;
    for (size_t i = 2; i < info.length; ++i) {
        if (!is_continuation(p[i])) return 0;
    }
    char32_t v = p[0] & (0x7F >> info.length);
    for (size_t i = 1; i < info.length; ++i) v = (v << 6) | (p[i] & 0x3F);
    *cp = v;
    return info.length;
}

void utf8_append(std::string &out, char32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

bool utf8_is_valid(std::string_view s) {
    char32_t cp = 0;
    while (!s.empty()) {
        const size_t n = utf8_decode(s, &cp);
        if (n == 0) return false;
        s.remove_prefix(n);
    }
    return true;
}

size_t utf8_complete_prefix(std::string_view s) {
    // Only the last (at most 3) bytes can hold an unfinished sequence: find its lead byte.
    const auto *p = reinterpret_cast<const uint8_t *>(s.data());
    const size_t n = s.size();
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        const size_t start = n - back;
        if (is_continuation(p[start])) continue;
        const LeadInfo info = lead_info(p[start]);
        if (info.length <= back) return n;  // ASCII, invalid lead, or already complete
        // Still waiting for bytes: hold back only if what is there can still become valid.
        if (back >= 2 && (p[start + 1] < info.second_lo || p[start + 1] > info.second_hi)) {
            return n;
        }
        return start;
    }
    return n;
}

}  // namespace ds4::tokenizer

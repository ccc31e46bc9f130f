#include "tokenizer/pre_tokenizer.h"

#include <array>
#include <cstdint>

#include "tokenizer/unicode_class.h"
#include "tokenizer/utf8.h"

namespace ds4::tokenizer {
namespace {

constexpr uint8_t kLetterOrMark = kClassLetter | kClassMark;
constexpr uint8_t kPunctOrSymbol = kClassPunct | kClassSymbol;

bool is_newline(char32_t cp) {
    return cp == '\r' || cp == '\n';
}
bool is_ascii_letter(char32_t cp) {
    return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
}

const std::array<uint8_t, 128> &ascii_classes() {
    static const std::array<uint8_t, 128> table = [] {
        std::array<uint8_t, 128> t{};
        for (char32_t c = 0; c < 128; ++c) t[c] = char_class(c);
        return t;
    }();
    return table;
}

// One valid UTF-8 stretch decoded into parallel arrays indexed by character; offset[n] is the
// byte length, so character i spans bytes [offset[i], offset[i+1]).
class Splitter {
  public:
    Splitter(std::string_view text, std::vector<std::string_view> &pieces)
        : text_(text), pieces_(pieces) {}

    void run() {
        decode();
        split_digits(0, cp_.size());
    }

  private:
    void decode() {
        const auto &ascii = ascii_classes();
        cp_.reserve(text_.size());
        cls_.reserve(text_.size());
        offset_.reserve(text_.size() + 1);
        size_t pos = 0;
        while (pos < text_.size()) {
            const auto byte = static_cast<uint8_t>(text_[pos]);
            char32_t cp = byte;
            size_t len = 1;
            if (byte >= 0x80) len = utf8_decode(text_.substr(pos), &cp);  // valid by contract
            cp_.push_back(cp);
            cls_.push_back(byte < 0x80 ? ascii[byte] : char_class(cp));
            offset_.push_back(static_cast<uint32_t>(pos));
            pos += len;
        }
        offset_.push_back(static_cast<uint32_t>(pos));
    }

    void emit(size_t begin, size_t end) {
        pieces_.push_back(text_.substr(offset_[begin], offset_[end] - offset_[begin]));
    }

    // Step 1: \p{N}{1,3}, Isolated.
    void split_digits(size_t lo, size_t hi) {
        size_t gap = lo;
        size_t i = lo;
        while (i < hi) {
            if (!(cls_[i] & kClassNumber)) {
                ++i;
                continue;
            }
            if (gap < i) split_cjk(gap, i);
            size_t j = i;
            while (j < hi && j - i < 3 && (cls_[j] & kClassNumber)) ++j;
            split_cjk(i, j);
            i = gap = j;
        }
        if (gap < hi) split_cjk(gap, hi);
    }

    // Step 2: [一-龥぀-ゟ゠-ヿ]+, Isolated.
    void split_cjk(size_t lo, size_t hi) {
        size_t gap = lo;
        size_t i = lo;
        while (i < hi) {
            if (!(cls_[i] & kClassCjk)) {
                ++i;
                continue;
            }
            if (gap < i) split_words(gap, i);
            size_t j = i + 1;
            while (j < hi && (cls_[j] & kClassCjk)) ++j;
            split_words(i, j);
            i = gap = j;
        }
        if (gap < hi) split_words(gap, hi);
    }

    // Step 3: the word/punctuation/whitespace regex, Isolated.
    void split_words(size_t lo, size_t hi) {
        size_t gap = lo;
        size_t i = lo;
        while (i < hi) {
            const size_t end = match_word_regex(i, hi);
            if (end == i) {
                ++i;
                continue;
            }
            if (gap < i) emit(gap, i);
            emit(i, end);
            i = gap = end;
        }
        if (gap < hi) emit(gap, hi);
    }

    size_t run_end(size_t j, size_t hi, uint8_t mask) const {
        while (j < hi && (cls_[j] & mask)) ++j;
        return j;
    }

    // End of the step-3 match starting at character i (the piece ends at hi), or i for none.
    size_t match_word_regex(size_t i, size_t hi) const {
        const uint8_t c0 = cls_[i];
        const bool has_next = i + 1 < hi;
        // [ASCII punct][A-Za-z]+
        if ((c0 & kClassAsciiPunct) && has_next && is_ascii_letter(cp_[i + 1])) {
            size_t j = i + 2;
            while (j < hi && is_ascii_letter(cp_[j])) ++j;
            return j;
        }
        // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : the optional prefix is tried first, and when
        // it cannot be followed by a letter the match falls back to a letter/mark run at i.
        const bool prefix_ok = !is_newline(cp_[i]) && !(c0 & (kClassLetter | kPunctOrSymbol));
        if (prefix_ok && has_next && (cls_[i + 1] & kLetterOrMark)) {
            return run_end(i + 2, hi, kLetterOrMark);
        }
        if (c0 & kLetterOrMark) return run_end(i + 1, hi, kLetterOrMark);
        //  ?[\p{P}\p{S}]+[\r\n]*
        size_t start = hi;
        if (cp_[i] == ' ' && has_next && (cls_[i + 1] & kPunctOrSymbol)) {
            start = i + 1;
        } else if (c0 & kPunctOrSymbol) {
            start = i;
        }
        if (start != hi) {
            size_t j = run_end(start, hi, kPunctOrSymbol);
            while (j < hi && is_newline(cp_[j])) ++j;
            return j;
        }
        if (!(c0 & kClassSpace)) return i;
        // Whitespace run [i, j). \s*[\r\n]+ backtracks to the run's last newline;
        // \s+(?!\S) takes the whole run at the end of the piece, else all but its last char
        // (which then joins the next word); a single space before a non-space is \s+.
        size_t j = i;
        size_t last_newline = hi;
        while (j < hi && (cls_[j] & kClassSpace)) {
            if (is_newline(cp_[j])) last_newline = j;
            ++j;
        }
        if (last_newline != hi) return last_newline + 1;
        if (j == hi || j - i == 1) return j;
        return j - 1;
    }

    std::string_view text_;
    std::vector<std::string_view> &pieces_;
    std::vector<char32_t> cp_;
    std::vector<uint8_t> cls_;
    std::vector<uint32_t> offset_;
};

}  // namespace

void pre_tokenize(std::string_view text, std::vector<std::string_view> &pieces) {
    // Cut at invalid bytes; each valid stretch is split on its own.
    size_t start = 0;
    size_t pos = 0;
    char32_t cp = 0;
    while (pos < text.size()) {
        const auto byte = static_cast<uint8_t>(text[pos]);
        if (byte < 0x80) {
            ++pos;
            continue;
        }
        const size_t len = utf8_decode(text.substr(pos), &cp);
        if (len != 0) {
            pos += len;
            continue;
        }
        if (start < pos) Splitter(text.substr(start, pos - start), pieces).run();
        pieces.push_back(text.substr(pos, 1));
        start = ++pos;
    }
    if (start < text.size()) Splitter(text.substr(start), pieces).run();
}

}  // namespace ds4::tokenizer

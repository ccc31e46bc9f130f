#include "tokenizer/unicode_class.h"

#include <utf8proc.h>

#include <array>
#include <cstring>
#include <map>
#include <vector>

namespace ds4::tokenizer {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr unsigned kBlockBits = 8;  // 256 code points per block
constexpr unsigned kBlockSize = 1u << kBlockBits;
constexpr unsigned kBlockCount = (kMaxCodePoint + 1) >> kBlockBits;  // 4352

// White_Space (PropList.txt): what Oniguruma matches with \s in UTF-8 mode. PCRE2's UCP \s would
// miss U+0085, and a general-category test would miss the C0 controls TAB..CR.
bool is_white_space(char32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

bool is_cjk(char32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x309F) ||
           (cp >= 0x30A0 && cp <= 0x30FF);
}

bool is_ascii_punct(char32_t cp) {
    return cp < 0x80 && cp > 0x20 && cp != 0x7F &&
           std::strchr("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", static_cast<int>(cp)) != nullptr;
}

// Characters newer than utf8proc's Unicode data, up to the oracle's Unicode version.
struct Addition {
    char32_t first;
    char32_t last;
    uint8_t flag;
};
constexpr Addition kUnicodeAdditions[] = {
#include "tokenizer/unicode_additions.inc"
};

uint8_t category_flag_of_addition(char32_t cp) {
    for (const Addition &a : kUnicodeAdditions) {
        if (cp >= a.first && cp <= a.last) return a.flag;
    }
    return 0;
}

uint8_t compute_class(char32_t cp) {
    uint8_t flags = 0;
    const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    if (category == UTF8PROC_CATEGORY_CN) flags |= category_flag_of_addition(cp);
    switch (category) {
        case UTF8PROC_CATEGORY_LU:
        case UTF8PROC_CATEGORY_LL:
        case UTF8PROC_CATEGORY_LT:
        case UTF8PROC_CATEGORY_LM:
        case UTF8PROC_CATEGORY_LO:
            flags |= kClassLetter;
            break;
        case UTF8PROC_CATEGORY_MN:
        case UTF8PROC_CATEGORY_MC:
        case UTF8PROC_CATEGORY_ME:
            flags |= kClassMark;
            break;
        case UTF8PROC_CATEGORY_ND:
        case UTF8PROC_CATEGORY_NL:
        case UTF8PROC_CATEGORY_NO:
            flags |= kClassNumber;
            break;
        case UTF8PROC_CATEGORY_PC:
        case UTF8PROC_CATEGORY_PD:
        case UTF8PROC_CATEGORY_PS:
        case UTF8PROC_CATEGORY_PE:
        case UTF8PROC_CATEGORY_PI:
        case UTF8PROC_CATEGORY_PF:
        case UTF8PROC_CATEGORY_PO:
            flags |= kClassPunct;
            break;
        case UTF8PROC_CATEGORY_SM:
        case UTF8PROC_CATEGORY_SC:
        case UTF8PROC_CATEGORY_SK:
        case UTF8PROC_CATEGORY_SO:
            flags |= kClassSymbol;
            break;
        default:
            break;
    }
    if (is_white_space(cp)) flags |= kClassSpace;
    if (is_cjk(cp)) flags |= kClassCjk;
    if (is_ascii_punct(cp)) flags |= kClassAsciiPunct;
    return flags;
}

// Two-stage table: block index -> one of the distinct 256-entry blocks. Most of the code space
// is made of identical blocks (unassigned planes, CJK ideographs), so this stays small (~100 KB).
struct ClassTable {
    std::array<uint16_t, kBlockCount> block_of{};
    std::vector<std::array<uint8_t, kBlockSize>> blocks;

    ClassTable() {
        std::map<std::array<uint8_t, kBlockSize>, uint16_t> seen;
        for (unsigned b = 0; b < kBlockCount; ++b) {
            std::array<uint8_t, kBlockSize> block{};
            for (unsigned i = 0; i < kBlockSize; ++i) {
                block[i] = compute_class(static_cast<char32_t>((b << kBlockBits) | i));
            }
            auto [it, inserted] = seen.emplace(block, static_cast<uint16_t>(blocks.size()));
            if (inserted) blocks.push_back(block);
            block_of[b] = it->second;
        }
    }
};

const ClassTable &class_table() {
    static const ClassTable table;
    return table;
}

}  // namespace

uint8_t char_class(char32_t cp) {
    if (cp > kMaxCodePoint) return 0;
    const ClassTable &t = class_table();
    return t.blocks[t.block_of[cp >> kBlockBits]][cp & (kBlockSize - 1)];
}

}  // namespace ds4::tokenizer

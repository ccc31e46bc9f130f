#pragma once
// Unicode character classes used by the DeepSeek V4 pre-tokenizer regexes.
//
// Each code point gets a set of flags: its general category group (\p{L}, \p{M}, \p{N}, \p{P},
// \p{S}) from utf8proc, completed for characters newer than utf8proc's Unicode version by
// unicode_additions.inc (generated from the UCD of the oracle's Unicode version, 16.0);
// White_Space membership as Oniguruma's \s sees it (HF `tokenizers` runs its regexes on
// Oniguruma); and the two ad-hoc sets the regexes spell out by hand (the CJK/kana ranges and
// ASCII punctuation). The table is built once on first use and is read-only afterwards.
#include <cstdint>

namespace ds4::tokenizer {

enum CharClassFlag : uint8_t {
    kClassLetter = 1u << 0,      // \p{L}: Lu Ll Lt Lm Lo
    kClassMark = 1u << 1,        // \p{M}: Mn Mc Me
    kClassNumber = 1u << 2,      // \p{N}: Nd Nl No
    kClassPunct = 1u << 3,       // \p{P}: Pc Pd Ps Pe Pi Pf Po
    kClassSymbol = 1u << 4,      // \p{S}: Sm Sc Sk So
    kClassSpace = 1u << 5,       // \s: the White_Space property
    kClassCjk = 1u << 6,         // [一-龥぀-ゟ゠-ヿ]: U+4E00-9FA5, U+3040-309F, U+30A0-30FF
    kClassAsciiPunct = 1u << 7,  // [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]
};

// Flags of one code point; 0 for unassigned, control, format, private-use and out-of-range values.
uint8_t char_class(char32_t cp);

}  // namespace ds4::tokenizer

#pragma once
// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
//
// The tokenizer accepts any bytes. Valid sequences are tokenized as text; a byte that does not
// start a valid sequence is an "invalid byte" and is handled on its own (see pre_tokenizer.h).
// Which bytes are invalid follows the standard left-to-right reading: a complete valid sequence
// is taken whole, anything else consumes exactly one byte.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ds4::tokenizer {

// Length (1-4) of the valid sequence starting at s[0], writing its code point to *cp;
// 0 when s[0] does not start a complete valid sequence within s.
size_t utf8_decode(std::string_view s, char32_t *cp);

// Appends the UTF-8 encoding of cp (which must be a valid scalar value).
void utf8_append(std::string &out, char32_t cp);

bool utf8_is_valid(std::string_view s);

// Number of leading bytes of s that can be emitted without splitting a character: everything
// except a trailing incomplete-but-still-possibly-valid sequence (e.g. "\xE2\x82" that a later
// "\xAC" would complete). Invalid bytes never wait: they can never become part of a character.
size_t utf8_complete_prefix(std::string_view s);

}  // namespace ds4::tokenizer

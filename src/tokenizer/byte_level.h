#pragma once
// GPT-2 byte-level alphabet: every byte is written as one printable code point, so a token string
// in the vocabulary spells its bytes without spaces or control characters.
//
// Bytes 33-126, 161-172 and 174-255 map to the same code point; the other 68 bytes (0-32,
// 127-160, 173) map to U+0100, U+0101, ... in increasing byte order (space -> 'Ġ' U+0120,
// '\n' -> 'Ċ' U+010A).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ds4::tokenizer {

char32_t byte_to_code_point(uint8_t byte);

// The byte a code point stands for, or nothing when it is not in the 256-symbol alphabet.
std::optional<uint8_t> code_point_to_byte(char32_t cp);

// UTF-8 of the byte-level spelling of `bytes` (what the vocabulary stores).
std::string byte_level_encode(std::string_view bytes);

// Bytes spelled by a byte-level string; nothing when some code point is outside the alphabet
// (added tokens such as "<｜User｜>" are stored literally and are not byte-level strings).
std::optional<std::string> byte_level_decode(std::string_view text);

}  // namespace ds4::tokenizer

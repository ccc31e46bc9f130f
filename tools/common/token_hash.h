#pragma once
// A fingerprint of a token sequence: two runs that generated the same tokens have the same hash,
// so a benchmark row can be checked against a baseline without storing the tokens.
#include <cstdint>
#include <span>
#include <string>

namespace ds4::tools {

// SHA-256 of the ids, each written as 4 little-endian bytes; 64 lowercase hex digits.
std::string tokens_sha256(std::span<const int32_t> ids);

}  // namespace ds4::tools

#pragma once
// Reading the oracle fixtures that gen_quant_fixtures.py writes to tests/quant/fixtures.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ds4::quant::testing {

// Bytes of tests/quant/fixtures/<name>; throws ds4::Error when the file cannot be read.
std::vector<uint8_t> read_fixture(const std::string &name);

// The same file as an array of T (little-endian, as written by numpy on x86).
template <typename T>
std::vector<T> read_fixture_as(const std::string &name) {
    const std::vector<uint8_t> bytes = read_fixture(name);
    std::vector<T> out(bytes.size() / sizeof(T));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
    return out;
}

}  // namespace ds4::quant::testing

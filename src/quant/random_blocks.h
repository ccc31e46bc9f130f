#pragma once
// Random but valid blocks of any supported format, reproducible from a seed: for synthetic
// models and for tests. Scales are finite and positive, quants cover their whole range (the
// int8 formats use -127..127, as the quantizers produce), Q8_K bsums match their quants, and
// the dequantized values lie within about +-magnitude.
#include <cstdint>
#include <vector>

#include "gguf/ggml_type.h"

namespace ds4::quant {

// Writes n_values values of `type` (n_values a multiple of the block size) to dst.
// Throws ds4::Error for a type without a generator or a magnitude that is not positive.
void fill_random_blocks(GgmlType type, void *dst, int64_t n_values, uint64_t seed,
                        float magnitude = 1.0f);

// Same, into a new buffer of row_size(type, n_values) bytes.
std::vector<uint8_t> random_blocks(GgmlType type, int64_t n_values, uint64_t seed,
                                   float magnitude = 1.0f);

}  // namespace ds4::quant

#pragma once
// Lookup tables of IQ2_XXS (docs/MODEL.md 5.4), the same data as ggml's iq2xxs_grid and
// ksigns_iq2xs; tests/quant checks them against gguf-py's copy.
#include <cstdint>

namespace ds4::quant {

// 256 grid points of 8 magnitudes each; byte j of entry k (bits 8j..8j+7) is one of 8, 25, 43.
extern const uint64_t kIq2xxsGrid[256];
// Sign patterns: bit j set = value j negative. Entry i is i with bit 7 set to the parity of i,
// so every pattern has an even number of negative values.
extern const uint8_t kIq2Signs[128];

}  // namespace ds4::quant

#pragma once
// The pooling step of the KV compressor (docs/MODEL.md 4.4), the CPU reference for its GPU twin
// (backend/cuda/kv_ops.h): runtime/compressor.cpp's compressor_push, the loop over columns, as a
// function of the window state alone. Per output column j < d, the candidates are
//   without overlap: (score, kv) of rows 0..r-1 at column j;
//   with overlap (ratio 4): rows 0..r-1 at column j (the previous window, first half of the
//     columns), then rows r..2r-1 at column d + j (the current window, second half);
// m = their maximum (std::max_element's value); m == -inf (no row written) -> pooled[j] = 0;
// else e_i = exp(s_i - m), den = sum e_i, num = sum e_i v_i (f32, candidate order, unfused),
// pooled[j] = num / den. The same f32 operations in the same order as the runtime's loop, so
// the bits are the same.
#include <cstdint>

namespace ds4::backend::cpu {

// kv, score: rows x width (rows = r, or 2 r with overlap; width = d, or 2 d with overlap; a
// score of -inf marks an unwritten row). ratio >= 1; pooled: d values.
void compressor_pool(const float *kv, const float *score, uint32_t ratio, bool overlap, uint32_t d,
                     uint32_t width, float *pooled);

}  // namespace ds4::backend::cpu

#pragma once
// Block formats as one table of row operations, dispatched by ggml type and CPU features.
//
//   dequantize_row : n values of a weight row -> f32
//   quantize_row   : f32 -> n values in the format (only for formats we produce)
//   quantize_activation_row : f32 activations -> the rows vec_dot takes (Q8_0 / Q8_K), as ds4
//                    quantizes them before a dot product
//   vec_dot        : one weight row . one activation row, where the activation row is in
//                    `vec_dot_type` (Q8_0 for Q8_0/MXFP4 weights, Q8_K for K-quants and IQ2_XXS,
//                    F32 for F32/F16/BF16). The result is a float.
//
// n is always a multiple of the format's block size. Every SIMD variant is tested against the
// scalar reference (tests/quant).
#include <cstddef>
#include <cstdint>

#include "gguf/ggml_type.h"

namespace ds4::quant {

// What each level needs from the CPU: exactly the instruction sets its kernels are compiled
// for (src/quant/CMakeLists.txt), so the compiler may use any of them.
//   AVX2:   avx2, fma, f16c, bmi2
//   AVX512: the AVX2 set and avx512f, avx512bw, avx512vl, avx512dq, avx512vnni
//   AVX512Vbmi: the AVX512 set and avx512vbmi, gfni (only IQ2_XXS differs from AVX512)
enum class SimdLevel { Scalar = 0, AVX2 = 1, AVX512 = 2, AVX512Vbmi = 3 };
constexpr SimdLevel kAllSimdLevels[] = {SimdLevel::Scalar, SimdLevel::AVX2, SimdLevel::AVX512,
                                        SimdLevel::AVX512Vbmi};
const char *simd_level_name(SimdLevel level);
// Best level this CPU supports, whatever the environment says (cached).
SimdLevel cpu_simd_level();
// The level in use: cpu_simd_level(), capped by DS4_SIMD=scalar|avx2|avx512|avx512vbmi if set
// (read once, on first use). Throws ds4::Error if DS4_SIMD holds anything else.
SimdLevel detected_simd_level();
// The rule detected_simd_level() applies: cpu capped by the DS4_SIMD value (null or empty:
// no cap). Throws ds4::Error for an unknown value.
SimdLevel cap_simd_level(SimdLevel cpu, const char *ds4_simd_value);

using DequantizeRowFn = void (*)(const void *src, float *dst, int64_t n);
using QuantizeRowFn = void (*)(const float *src, void *dst, int64_t n);
using VecDotFn = float (*)(int64_t n, const void *w_row, const void *act_row);
// out[j * out_stride + i] = vec_dot(n, w_rows + i * w_stride bytes, act_rows + j * act_stride
// bytes) for i < n_w weight rows and j < m activation rows, bit for bit (prefill: many tokens).
// Each weight row is decoded once for all m rows; a kernel may also take several weight rows
// per pass, so that an activation block loaded from L2 serves all of them.
using VecDotMultiFn = void (*)(int64_t n, const void *w_rows, size_t w_stride, int64_t n_w,
                               const void *act_rows, size_t act_stride, int64_t m, float *out,
                               int64_t out_stride);

// A multi-row kernel's per-call tables of the activation rows (Q8_0: each block's scale and sum),
// in three parts so that a matmul builds them once for all its chunks of weight rows: their bytes
// for m rows of n values (0: none), building them, and the product that reads them, with
// vec_dot_multi's contract and bits.
using MultiTablesBytesFn = size_t (*)(int64_t n, int64_t m);
using MakeMultiTablesFn = void (*)(int64_t n, const void *act_rows, size_t act_stride, int64_t m,
                                   void *tables);
using VecDotMultiTablesFn = void (*)(int64_t n, const void *w_rows, size_t w_stride, int64_t n_w,
                                     const void *act_rows, size_t act_stride, int64_t m,
                                     const void *tables, float *out, int64_t out_stride);
struct MultiRowTables {
    MultiTablesBytesFn bytes = nullptr;  // null where the kernel has no tables
    MakeMultiTablesFn make = nullptr;
    VecDotMultiTablesFn dot = nullptr;
};

// How quantized activation rows are arranged. Blocks: consecutive vec_dot_type blocks.
// Iq2xxsPositionMajor: the IQ2_XXS kernel of the AVX512Vbmi level wants each pair of Q8_K
// super-blocks transposed so that one register holds value j of 64 groups of 8, then the
// scales, then -64 x each sub-block's sum (kernels_avx512_vbmi.cpp); same int8 values, same
// number of bytes as the Q8_K row.
enum class ActivationLayout { Blocks = 0, Iq2xxsPositionMajor = 1 };

struct TypeKernels {
    GgmlType type;
    GgmlType vec_dot_type;           // the activation format vec_dot expects
    DequantizeRowFn dequantize_row;  // never null for supported types
    QuantizeRowFn quantize_row;      // null when we never produce this format
    // f32 activations -> the rows vec_dot takes, by ds4's rules: for a weight type, its
    // vec_dot_type rows in activation_layout; for Q8_0 and Q8_K as activation types, their own
    // blocks. Null where vec_dot takes f32 (F32, F16, BF16). For Q8_0 it rounds x / d where
    // quantize_row (the weight quantizer, equal to gguf-py) rounds x * (1/d) half away from zero
    // (kernels_ref.h).
    QuantizeRowFn quantize_activation_row;
    VecDotFn vec_dot;                    // null for Q8_K, which is never a weight format
    VecDotMultiFn vec_dot_multi;         // null where only vec_dot exists (matmul calls it per row)
    ActivationLayout activation_layout;  // of the rows quantize_activation_row writes
    // matmul also takes vec_dot_multi for a single activation row (a decode matvec): set where
    // the multi-row kernel beats vec_dot row by row even then (Q8_0: the activation's block
    // sums and scales, at AVX2 its values widened to int16, are computed once for all weight rows).
    bool vec_dot_multi_for_one_row;
    MultiRowTables multi_tables;
    // The multi-row kernel works on panels of this many weight rows (Q8_0: 16 at AVX-512, 8 at
    // AVX2; 0: no panels): matmul rounds its chunks of weight rows up to a multiple of it when
    // there are several activation rows, so that no chunk but a matrix's last leaves lanes empty.
    int multi_row_panel;
};

bool is_supported(GgmlType type);
// Kernels for `type` at detected_simd_level() (or at `level`, falling back to lower levels
// for what a level does not implement). Throws ds4::Error for unsupported types, and for a
// level above cpu_simd_level() (its kernels would not run here).
const TypeKernels &kernels(GgmlType type);
const TypeKernels &kernels(GgmlType type, SimdLevel level);

// Convenience wrappers over the table at the detected level. They check that n is a
// multiple of the block size, and quantize_row that the format can be produced.
void dequantize_row(GgmlType type, const void *src, float *dst, int64_t n);
void quantize_row(GgmlType type, const float *src, void *dst, int64_t n);
// Bytes of a row of n values (same as ggml_row_bytes).
size_t row_size(GgmlType type, int64_t n);

}  // namespace ds4::quant

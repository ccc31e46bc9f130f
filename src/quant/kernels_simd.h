#pragma once
// x86 SIMD kernels, one namespace per instruction set. Each function has the same contract as
// its twin in kernels_ref.h; activation quantizers are bit-identical to the reference, dot
// products agree within float reassociation (Q8_0's bit for bit: it has one fixed order, q8_0.cpp).
// Only call a level that detected_simd_level() allows.
#include <cstddef>
#include <cstdint>

namespace ds4::quant {

#define DS4_SIMD_KERNEL_DECLS                                                  \
    void quantize_row_q8_0(const float *src, void *dst, int64_t n);            \
    void quantize_row_q8_0_activation(const float *src, void *dst, int64_t n); \
    void quantize_row_q8_K(const float *src, void *dst, int64_t n);            \
    float vec_dot_f32_f32(int64_t n, const void *w, const void *x);            \
    float vec_dot_f16_f32(int64_t n, const void *w, const void *x);            \
    float vec_dot_bf16_f32(int64_t n, const void *w, const void *x);           \
    float vec_dot_q8_0_q8_0(int64_t n, const void *w, const void *x);          \
    float vec_dot_mxfp4_q8_0(int64_t n, const void *w, const void *x);         \
    float vec_dot_q2_K_q8_K(int64_t n, const void *w, const void *x);          \
    float vec_dot_q4_K_q8_K(int64_t n, const void *w, const void *x);          \
    float vec_dot_iq2_xxs_q8_K(int64_t n, const void *w, const void *x);       \
    void dequantize_row_f16(const void *src, float *dst, int64_t n);

// A multi-row dot (quant.h VecDotMultiFn): out[j * out_stride + i] = vec_dot(n, w + i * w_stride,
// x + j * x_stride), bit for bit, each of the n_w weight rows decoded once for all m activation
// rows.
using VecDotMultiKernel = void(int64_t n, const void *w, size_t w_stride, int64_t n_w,
                               const void *x, size_t x_stride, int64_t m, float *out,
                               int64_t out_stride);

// Q8_0's multi-row kernel in parts (quant.h MultiRowTables), so that a matmul builds the
// activations' tables once for all its chunks of weight rows: the tables' bytes for m activation
// rows of n values, the tables, and the product that reads them (dispatch.cpp's
// multi_with_own_tables runs the three in a row as a VecDotMultiFn).
#define DS4_Q8_0_MULTI_DECLS                                                                    \
    size_t q8_0_multi_tables_bytes(int64_t n, int64_t m);                                       \
    void make_q8_0_multi_tables(int64_t n, const void *x, size_t x_stride, int64_t m,           \
                                void *tables);                                                  \
    void vec_dot_multi_q8_0_q8_0_tables(int64_t n, const void *w, size_t w_stride, int64_t n_w, \
                                        const void *x, size_t x_stride, int64_t m,              \
                                        const void *tables, float *out, int64_t out_stride);

namespace avx2 {
DS4_SIMD_KERNEL_DECLS
DS4_Q8_0_MULTI_DECLS
VecDotMultiKernel vec_dot_multi_f32_f32, vec_dot_multi_f16_f32, vec_dot_multi_bf16_f32;
}  // namespace avx2
namespace avx512 {
DS4_SIMD_KERNEL_DECLS
DS4_Q8_0_MULTI_DECLS
VecDotMultiKernel vec_dot_multi_f32_f32, vec_dot_multi_f16_f32, vec_dot_multi_bf16_f32,
    vec_dot_multi_q2_K_q8_K, vec_dot_multi_q4_K_q8_K, vec_dot_multi_iq2_xxs_q8_K;
}  // namespace avx512
// IQ2_XXS with VBMI + GFNI shuffles (kernels_avx512_vbmi.cpp): the activation rows are in
// ActivationLayout::Iq2xxsPositionMajor, written by quantize_row_q8_K_iq2_xxs.
namespace avx512vbmi {
void quantize_row_q8_K_iq2_xxs(const float *src, void *dst, int64_t n);
float vec_dot_iq2_xxs_q8_K(int64_t n, const void *w, const void *x);
VecDotMultiKernel vec_dot_multi_iq2_xxs_q8_K;
}  // namespace avx512vbmi

#undef DS4_SIMD_KERNEL_DECLS
#undef DS4_Q8_0_MULTI_DECLS

}  // namespace ds4::quant

#pragma once
// Scalar reference kernels: the readable definition of every format, and the twin that each
// SIMD kernel is tested against. Row length n is a multiple of the block size.
//
// Dequantizers are bit-identical to ggml (and to gguf-py's numpy decoders): each value is the
// same f32 expression, evaluated in the same order, without fused multiply-add.
// Dot products use int32 sums inside a block and one f32 accumulator across blocks, except the
// F32/F16/BF16 dots, which accumulate exact f32*f32 products in double and round once.
#include <cstdint>

namespace ds4::quant::ref {

// f32 <-> f16 / bf16 conversions.
// f16: round to nearest even; overflow gives inf; subnormals exact; NaN stays NaN (quiet, top
// payload bits kept). bf16: ggml's rule: round to nearest even on the bit pattern, NaN forced
// quiet by setting bit 6 of the bf16 pattern.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
// MXFP4's E8M0 exponent as half the block scale: 2^(e-128) (subnormal for e < 2), matching
// ggml's GGML_E8M0_TO_FP32_HALF; the doubled E2M1 table then gives value = table * half.
float e8m0_to_f32_half(uint8_t e);
// E2M1 codes times two: {0, .5, 1, 1.5, 2, 3, 4, 6} doubled, sign in bit 3.
extern const int8_t kMxfp4DoubledValues[16];

void dequantize_row_f32(const void *src, float *dst, int64_t n);
void dequantize_row_f16(const void *src, float *dst, int64_t n);
void dequantize_row_bf16(const void *src, float *dst, int64_t n);
void dequantize_row_q8_0(const void *src, float *dst, int64_t n);
void dequantize_row_q2_K(const void *src, float *dst, int64_t n);
void dequantize_row_q4_K(const void *src, float *dst, int64_t n);
void dequantize_row_iq2_xxs(const void *src, float *dst, int64_t n);
void dequantize_row_q8_K(const void *src, float *dst, int64_t n);
void dequantize_row_mxfp4(const void *src, float *dst, int64_t n);

void quantize_row_f32(const float *src, void *dst, int64_t n);
void quantize_row_f16(const float *src, void *dst, int64_t n);
void quantize_row_bf16(const float *src, void *dst, int64_t n);
// Q8_0, ggml's reference (and gguf-py's, bit for bit), per block of 32, all in f32:
//   amax = max |x|;  d = amax / 127;  id = d != 0 ? 1 / d : 0;
//   q[i] = roundf(x[i] * id)   (round half away from zero);  stored d = f32_to_f16(d).
void quantize_row_q8_0(const float *src, void *dst, int64_t n);
// Q8_0 activations, ds4's rule (docs/MODEL.md 5.1, quantize_q8_0_activation): d = amax / 127 (f32),
//   q[i] = clamp(lrint(x[i] / d), -128, 127)  (a division, round half to even), d = 0 -> q = 0;
//   stored d = f32_to_f16(d). NaN or out-of-range quotients give -128, as x86's cvtps2dq.
// It differs from the weight quantizer above on near-ties: x * (1/d) is not x / d.
void quantize_row_q8_0_activation(const float *src, void *dst, int64_t n);
// Q8_0 activations as llama.cpp's x86 CPU backend quantizes them (ggml-cpu quantize_row_q8_0 for
// AVX/AVX2/AVX-512): id = 127 / amax (0 when amax = 0), q[i] = round half to even of x[i] * id;
// stored d = f32_to_f16(amax / 127). Only for comparisons with llama.cpp (docs/LLAMACPP.md).
void quantize_row_q8_0_llamacpp(const float *src, void *dst, int64_t n);
// Q8_K, the ds4 activation quantizer (docs/MODEL.md 5.5), per block of 256, all in f32:
//   vmax = the FIRST element of largest |x| (signed);  vmax == 0 -> d = 0, q = 0, bsums = 0;
//   iscale = -127 / vmax;  q[i] = clamp(lrint(iscale * x[i]), -128, 127) (round half to even);
//   d = 1 / iscale;  bsums[k] = sum of q[16k .. 16k+15].
void quantize_row_q8_K(const float *src, void *dst, int64_t n);
// Q2_K / Q4_K: ggml's reference quantizers (quantize_row_q2_K_ref / quantize_row_q4_K_ref,
// no importance matrix): a weighted least-squares search for each sub-block's scale and min,
// then 4-bit (Q2_K) or 6-bit (Q4_K) quantization of those against f16 super-scales.
void quantize_row_q2_K(const float *src, void *dst, int64_t n);
void quantize_row_q4_K(const float *src, void *dst, int64_t n);
// IQ2_XXS: ggml's quantize_row_iq2_xxs_impl with an all-ones importance matrix (byte for byte).
// Per block: sigma2 = mean x^2, weights w = sqrt(sigma2 + x^2). Per 32-value group: signs with
// even parity per 8 values (an odd count flips the value of smallest w x^2); the 0..4-level
// weighted fit s0 of |x|; 13 candidate inverse scales (5 + 0.1 k) / (3 s0), k = -6..6, each
// rounding |x| to levels 0..2 per 8 values and replacing a pattern that is not one of the 256
// grid points by the neighbour (grid points at the two nearest distances, built once) of least
// weighted error; the candidate of largest (sum w x q)^2 / sum w q^2 wins, is re-rounded at its
// least-squares scale, which is refitted. d = f16(max scale / 31), ls = round((scale/d - 1)/2)
// clamped to 0..15. A group with max |x| < 1e-15 is stored as zero indices and signs with ls 0
// (decoded as +d: the format has no zero); an all-zero block has d = 0.
// Throws ds4::Error for a non-finite value (position given). Finite values so large that the
// sums of squares overflow f32 (|x| > ~1e18) give a block of valid fields whose d is not finite,
// and any value beyond the f16 d's reach (~1e7) decodes as +-inf.
void quantize_row_iq2_xxs(const float *src, void *dst, int64_t n);

float vec_dot_f32_f32(int64_t n, const void *w, const void *x);
float vec_dot_f16_f32(int64_t n, const void *w, const void *x);
float vec_dot_bf16_f32(int64_t n, const void *w, const void *x);
float vec_dot_q8_0_q8_0(int64_t n, const void *w, const void *x);
float vec_dot_mxfp4_q8_0(int64_t n, const void *w, const void *x);
float vec_dot_q2_K_q8_K(int64_t n, const void *w, const void *x);
float vec_dot_q4_K_q8_K(int64_t n, const void *w, const void *x);
float vec_dot_iq2_xxs_q8_K(int64_t n, const void *w, const void *x);

}  // namespace ds4::quant::ref

// The one place that picks kernels by CPU features: a table per SIMD level, chosen at run time.
#include <array>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/error.h"
#include "quant/kernel_scratch.h"
#include "quant/kernels_ref.h"
#include "quant/kernels_simd.h"
#include "quant/quant.h"

namespace ds4::quant {
namespace {

constexpr size_t kNumTypes = 9;
using KernelTable = std::array<TypeKernels, kNumTypes>;

KernelTable scalar_table() {
    using namespace ref;
    using T = GgmlType;
    return {{
        // type, vec_dot_type, dequantize_row, quantize_row, quantize_activation_row, vec_dot
        {T::F32, T::F32, dequantize_row_f32, quantize_row_f32, nullptr, vec_dot_f32_f32},
        {T::F16, T::F32, dequantize_row_f16, quantize_row_f16, nullptr, vec_dot_f16_f32},
        {T::BF16, T::F32, dequantize_row_bf16, quantize_row_bf16, nullptr, vec_dot_bf16_f32},
        {T::Q8_0, T::Q8_0, dequantize_row_q8_0, quantize_row_q8_0, quantize_row_q8_0_activation,
         vec_dot_q8_0_q8_0},
        {T::MXFP4, T::Q8_0, dequantize_row_mxfp4, nullptr, quantize_row_q8_0_activation,
         vec_dot_mxfp4_q8_0},
        {T::Q2_K, T::Q8_K, dequantize_row_q2_K, quantize_row_q2_K, quantize_row_q8_K,
         vec_dot_q2_K_q8_K},
        {T::Q4_K, T::Q8_K, dequantize_row_q4_K, quantize_row_q4_K, quantize_row_q8_K,
         vec_dot_q4_K_q8_K},
        {T::IQ2_XXS, T::Q8_K, dequantize_row_iq2_xxs, quantize_row_iq2_xxs, quantize_row_q8_K,
         vec_dot_iq2_xxs_q8_K},
        {T::Q8_K, T::Q8_K, dequantize_row_q8_K, quantize_row_q8_K, quantize_row_q8_K, nullptr},
    }};
}

// Replaces the dot products, the activation quantizers (Q8_0, Q8_K), the Q8_0 weight quantizer
// and the F16 dequantizer (the KV cache's rows) with one instruction set's versions; the other
// dequantizers and the K-quant / IQ2_XXS weight quantizers stay scalar. Multi-row dots are set
// below: the float formats' and Q8_0's at AVX2, every format's at AVX-512.
#define DS4_SIMD_TABLE(name, ns)                                                  \
    KernelTable name##_table() {                                                  \
        KernelTable table = scalar_table();                                       \
        for (TypeKernels & k : table) {                                           \
            switch (k.type) {                                                     \
                case GgmlType::F32:                                               \
                    k.vec_dot = ns::vec_dot_f32_f32;                              \
                    break;                                                        \
                case GgmlType::F16:                                               \
                    k.vec_dot = ns::vec_dot_f16_f32;                              \
                    k.dequantize_row = ns::dequantize_row_f16;                    \
                    break;                                                        \
                case GgmlType::BF16:                                              \
                    k.vec_dot = ns::vec_dot_bf16_f32;                             \
                    break;                                                        \
                case GgmlType::Q8_0:                                              \
                    k.vec_dot = ns::vec_dot_q8_0_q8_0;                            \
                    k.quantize_row = ns::quantize_row_q8_0;                       \
                    k.quantize_activation_row = ns::quantize_row_q8_0_activation; \
                    break;                                                        \
                case GgmlType::MXFP4:                                             \
                    k.vec_dot = ns::vec_dot_mxfp4_q8_0;                           \
                    k.quantize_activation_row = ns::quantize_row_q8_0_activation; \
                    break;                                                        \
                case GgmlType::Q2_K:                                              \
                    k.vec_dot = ns::vec_dot_q2_K_q8_K;                            \
                    k.quantize_activation_row = ns::quantize_row_q8_K;            \
                    break;                                                        \
                case GgmlType::Q4_K:                                              \
                    k.vec_dot = ns::vec_dot_q4_K_q8_K;                            \
                    k.quantize_activation_row = ns::quantize_row_q8_K;            \
                    break;                                                        \
                case GgmlType::IQ2_XXS:                                           \
                    k.vec_dot = ns::vec_dot_iq2_xxs_q8_K;                         \
                    k.quantize_activation_row = ns::quantize_row_q8_K;            \
                    break;                                                        \
                case GgmlType::Q8_K:                                              \
                    k.quantize_row = ns::quantize_row_q8_K;                       \
                    k.quantize_activation_row = ns::quantize_row_q8_K;            \
                    break;                                                        \
                default:                                                          \
                    break;                                                        \
            }                                                                     \
        }                                                                         \
        return table;                                                             \
    }
DS4_SIMD_TABLE(avx2_single, avx2)
DS4_SIMD_TABLE(avx512_single, avx512)
#undef DS4_SIMD_TABLE

// A multi-row kernel with tables as a VecDotMultiFn: the tables in the calling thread's scratch,
// built for this call.
template <MultiTablesBytesFn kBytes, MakeMultiTablesFn kMake, VecDotMultiTablesFn kDot>
void multi_with_own_tables(int64_t n, const void *w, size_t w_stride, int64_t n_w, const void *x,
                           size_t x_stride, int64_t m, float *out, int64_t out_stride) {
    void *tables = kernel_scratch(1, kBytes(n, m));
    kMake(n, x, x_stride, m, tables);
    kDot(n, w, w_stride, n_w, x, x_stride, m, tables, out, out_stride);
}

// Q8_0's kernel with tables at one level: the three parts, the VecDotMultiFn made of them, also
// for a single activation row, and its panel height.
template <MultiTablesBytesFn kBytes, MakeMultiTablesFn kMake, VecDotMultiTablesFn kDot>
void use_multi_tables(TypeKernels &k, int panel_rows) {
    k.vec_dot_multi = multi_with_own_tables<kBytes, kMake, kDot>;
    k.vec_dot_multi_for_one_row = true;
    k.multi_tables = {kBytes, kMake, kDot};
    k.multi_row_panel = panel_rows;
}

KernelTable avx2_table() {
    KernelTable table = avx2_single_table();
    for (TypeKernels &k : table) {
        if (k.type == GgmlType::F32) k.vec_dot_multi = avx2::vec_dot_multi_f32_f32;
        if (k.type == GgmlType::F16) k.vec_dot_multi = avx2::vec_dot_multi_f16_f32;
        if (k.type == GgmlType::BF16) k.vec_dot_multi = avx2::vec_dot_multi_bf16_f32;
        if (k.type == GgmlType::Q8_0)
            use_multi_tables<avx2::q8_0_multi_tables_bytes, avx2::make_q8_0_multi_tables,
                             avx2::vec_dot_multi_q8_0_q8_0_tables>(k, 8);
    }
    return table;
}

KernelTable avx512_table() {
    KernelTable table = avx512_single_table();
    for (TypeKernels &k : table) {
        if (k.type == GgmlType::F32) k.vec_dot_multi = avx512::vec_dot_multi_f32_f32;
        if (k.type == GgmlType::F16) k.vec_dot_multi = avx512::vec_dot_multi_f16_f32;
        if (k.type == GgmlType::BF16) k.vec_dot_multi = avx512::vec_dot_multi_bf16_f32;
        if (k.type == GgmlType::Q8_0)
            use_multi_tables<avx512::q8_0_multi_tables_bytes, avx512::make_q8_0_multi_tables,
                             avx512::vec_dot_multi_q8_0_q8_0_tables>(k, 16);
        if (k.type == GgmlType::Q2_K) k.vec_dot_multi = avx512::vec_dot_multi_q2_K_q8_K;
        if (k.type == GgmlType::Q4_K) k.vec_dot_multi = avx512::vec_dot_multi_q4_K_q8_K;
        if (k.type == GgmlType::IQ2_XXS) k.vec_dot_multi = avx512::vec_dot_multi_iq2_xxs_q8_K;
    }
    return table;
}

// AVX-512 with VBMI and GFNI: only IQ2_XXS changes, to shuffle lookups that take their
// activations position-major.
KernelTable avx512_vbmi_table() {
    KernelTable table = avx512_table();
    for (TypeKernels &k : table) {
        if (k.type != GgmlType::IQ2_XXS) continue;
        k.vec_dot = avx512vbmi::vec_dot_iq2_xxs_q8_K;
        k.vec_dot_multi = avx512vbmi::vec_dot_multi_iq2_xxs_q8_K;
        k.quantize_activation_row = avx512vbmi::quantize_row_q8_K_iq2_xxs;
        k.activation_layout = ActivationLayout::Iq2xxsPositionMajor;
    }
    return table;
}

const KernelTable &table_for(SimdLevel level) {
    static const KernelTable scalar = scalar_table();
    static const KernelTable avx2 = avx2_table();
    static const KernelTable avx512 = avx512_table();
    static const KernelTable avx512_vbmi = avx512_vbmi_table();
    switch (level) {
        case SimdLevel::AVX512Vbmi:
            return avx512_vbmi;
        case SimdLevel::AVX512:
            return avx512;
        case SimdLevel::AVX2:
            return avx2;
        case SimdLevel::Scalar:
            break;
    }
    return scalar;
}

SimdLevel probe_cpu() {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
    if (!avx2) return SimdLevel::Scalar;
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vnni");
    if (!avx512) return SimdLevel::AVX2;
    const bool vbmi = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni");
    return vbmi ? SimdLevel::AVX512Vbmi : SimdLevel::AVX512;
}

}  // namespace

const char *simd_level_name(SimdLevel level) {
    switch (level) {
        case SimdLevel::Scalar:
            return "scalar";
        case SimdLevel::AVX2:
            return "avx2";
        case SimdLevel::AVX512:
            return "avx512";
        case SimdLevel::AVX512Vbmi:
            return "avx512vbmi";
    }
    return "unknown";
}

SimdLevel cpu_simd_level() {
    static const SimdLevel level = probe_cpu();
    return level;
}

SimdLevel cap_simd_level(SimdLevel cpu, const char *ds4_simd_value) {
    if (ds4_simd_value == nullptr || *ds4_simd_value == '\0') return cpu;
    const std::string_view value(ds4_simd_value);
    for (SimdLevel cap : kAllSimdLevels)
        if (value == simd_level_name(cap)) return cap < cpu ? cap : cpu;
    throw Error("DS4_SIMD=" + std::string(value) +
                " is not a SIMD level: expected scalar, avx2, avx512 or avx512vbmi");
}

SimdLevel detected_simd_level() {
    static const SimdLevel level = cap_simd_level(cpu_simd_level(), std::getenv("DS4_SIMD"));
    return level;
}

bool is_supported(GgmlType type) {
    for (const TypeKernels &k : table_for(SimdLevel::Scalar))
        if (k.type == type) return true;
    return false;
}

const TypeKernels &kernels(GgmlType type, SimdLevel level) {
    if (level > cpu_simd_level())
        throw Error(std::string("SIMD level ") + simd_level_name(level) +
                    " requested, but this CPU supports only " + simd_level_name(cpu_simd_level()));
    for (const TypeKernels &k : table_for(level))
        if (k.type == type) return k;
    throw Error("no kernels for tensor type " + std::string(ggml_type_name(type)) +
                ": supported are F32, F16, BF16, Q8_0, MXFP4, Q2_K, Q4_K, IQ2_XXS, Q8_K");
}

const TypeKernels &kernels(GgmlType type) {
    return kernels(type, detected_simd_level());
}

namespace {
void check_row_length(GgmlType type, int64_t n) {
    const uint32_t block = ggml_type_info(type).block_elems;
    if (n < 0 || n % block != 0)
        throw Error("row of " + std::to_string(n) + " values is not a multiple of the " +
                    std::string(ggml_type_name(type)) + " block size " + std::to_string(block));
}
}  // namespace

void dequantize_row(GgmlType type, const void *src, float *dst, int64_t n) {
    const TypeKernels &k = kernels(type);
    check_row_length(type, n);
    k.dequantize_row(src, dst, n);
}

void quantize_row(GgmlType type, const float *src, void *dst, int64_t n) {
    const TypeKernels &k = kernels(type);
    if (k.quantize_row == nullptr)
        throw Error("quantizing to " + std::string(ggml_type_name(type)) + " is not supported");
    check_row_length(type, n);
    k.quantize_row(src, dst, n);
}

size_t row_size(GgmlType type, int64_t n) {
    if (n < 0) throw Error("row of " + std::to_string(n) + " values: length must not be negative");
    return static_cast<size_t>(ggml_row_bytes(type, static_cast<uint64_t>(n)));
}

}  // namespace ds4::quant

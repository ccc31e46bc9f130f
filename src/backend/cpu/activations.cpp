#include "backend/cpu/activations.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cpu/thread_pool.h"
#include "common/error.h"
#include "quant/kernels_ref.h"
#include "quant/quant.h"

namespace ds4::backend::cpu {
namespace {

constexpr size_t kScratchAlignment = 64;

// Rows per parallel task when quantizing: about 64 KiB of input floats, so a small batch stays
// on the caller (a dispatch costs about as much as quantizing a few thousand values).
int64_t quantize_grain(int64_t k) {
    return std::max<int64_t>(1, (int64_t{16} << 10) / k);
}

}  // namespace

void ScratchBuffer::FreeAligned::operator()(void *p) const {
    std::free(p);
}

void *ScratchBuffer::reserve(size_t bytes) {
    if (bytes <= capacity_) return data_.get();
    const size_t rounded = (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
    void *p = std::aligned_alloc(kScratchAlignment, rounded);
    if (p == nullptr)
        throw Error("ScratchBuffer: cannot allocate " + std::to_string(rounded) + " bytes");
    data_.reset(p);
    capacity_ = rounded;
    return p;
}

ActivationRows quantize_activations(ThreadPool &pool, ScratchBuffer &scratch,
                                    ds4::GgmlType weight_type, const float *X, int64_t m, int64_t k,
                                    ActivationRounding rounding) {
    const quant::TypeKernels &wk = quant::kernels(weight_type);
    const GgmlType act_type = wk.vec_dot_type;
    if (act_type == GgmlType::F32)
        return {act_type, X, m, k, static_cast<size_t>(k) * sizeof(float)};

    quant::QuantizeRowFn quantize = wk.quantize_activation_row;
    if (rounding == ActivationRounding::LlamaCpp && act_type == GgmlType::Q8_0)
        quantize = quant::ref::quantize_row_q8_0_llamacpp;
    if (quantize == nullptr)
        throw Error("quantize_activations: no quantizer for activation type " +
                    std::string(ggml_type_name(act_type)));
    const size_t row_bytes = quant::row_size(act_type, k);
    auto *out = static_cast<uint8_t *>(scratch.reserve(row_bytes * static_cast<size_t>(m)));
    pool.parallel_for(m, quantize_grain(k), [&](int64_t begin, int64_t end, int) {
        for (int64_t j = begin; j < end; ++j)
            quantize(X + j * k, out + static_cast<size_t>(j) * row_bytes, k);
    });
    return {act_type, out, m, k, row_bytes, wk.activation_layout};
}

}  // namespace ds4::backend::cpu

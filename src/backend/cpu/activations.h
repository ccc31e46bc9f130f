#pragma once
// Activation rows in the format a weight type's dot product expects (quant::TypeKernels::
// vec_dot_type): Q8_0 for Q8_0/MXFP4 weights, Q8_K for Q2_K/Q4_K/IQ2_XXS, F32 for F32/F16/BF16.
//
// An activation row is quantized once and then dotted with every weight row, so a matrix that
// shares its input with others (an expert's gate and up, or several experts) can reuse one
// quantization. F32 activations are used in place, without a copy.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "gguf/ggml_type.h"
#include "quant/quant.h"

namespace ds4::backend::cpu {

class ThreadPool;

// m rows of k values in `type`, arranged as `layout`; row j starts at data + j * row_stride
// bytes. Only a weight type whose kernels take that type and layout may use them.
struct ActivationRows {
    ds4::GgmlType type;
    const void *data;
    int64_t m;
    int64_t k;
    size_t row_stride;
    quant::ActivationLayout layout = quant::ActivationLayout::Blocks;
};

// A growable, 64-byte aligned buffer. It reallocates only when asked for more than it ever held,
// so a steady decode or prefill loop allocates nothing. One per caller thread.
class ScratchBuffer {
  public:
    void *reserve(size_t bytes);
    size_t capacity() const { return capacity_; }

  private:
    struct FreeAligned {
        void operator()(void *p) const;
    };
    std::unique_ptr<void, FreeAligned> data_;
    size_t capacity_ = 0;
};

// Brings X (m rows of k floats, dense) into the activation format of `weight_type`, writing
// into `scratch` when a conversion is needed. The result points into X or into scratch and is
// valid until the next use of that scratch. Several rows are quantized in parallel.
// How activations are rounded into Q8_0: ds4's rule (the engine), or llama.cpp's x86 one (only
// to compare with it; quant/kernels_ref.h). Q8_K is the same in both.
enum class ActivationRounding { Ds4, LlamaCpp };
ActivationRows quantize_activations(ThreadPool &pool, ScratchBuffer &scratch,
                                    ds4::GgmlType weight_type, const float *X, int64_t m, int64_t k,
                                    ActivationRounding rounding = ActivationRounding::Ds4);

}  // namespace ds4::backend::cpu

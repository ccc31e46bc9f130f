#pragma once
// Numerical options of a forward pass, for every backend.
#include <optional>

namespace ds4::runtime {

struct ForwardOptions {
    // Simulate the FP8 KV and Hadamard+FP4 indexer quantization the model was trained with
    // (docs/MODEL.md 4.0). Off only to compare with references that omit it (transformers).
    bool qat_sim = true;
    // Round as llama.cpp's CPU backend does, for comparisons with it only (docs/LLAMACPP.md):
    // activations of F16 weights are rounded to f16 (ggml converts them to the weight's type),
    // and the route weight scales each expert's output after W2 instead of its input before.
    // Both are equal to the default in exact arithmetic; ds4 keeps f32 (docs/MODEL.md 4.6, 10.4).
    // The CPU backend only.
    bool llama_cpp_rounding = false;
    // Fill every buffer of a batch with this value when it is taken (Ops::buffer's values are
    // unspecified). For tests: sessions with different fills give the same results only if no
    // operation reads a value that no operation wrote. The CPU backend only.
    std::optional<float> buffer_fill;
};

}  // namespace ds4::runtime

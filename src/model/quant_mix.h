#pragma once
// The quant mixes our tools write: which GGML type each tensor role gets.
#include <string>

#include "gguf/ggml_type.h"
#include "model/tensor_layout.h"

namespace ds4::model {

enum class QuantMix {
    F32,   // every tensor F32 (tid2eid I32)
    Q8_0,  // published types, routed experts Q8_0
    Q2,    // published q2: routed gate/up IQ2_XXS, down Q2_K
    Q4,    // published q4: routed Q4_K
};

QuantMix parse_quant_mix(const std::string &name);  // "f32" | "q8_0" | "q2" | "q4"
const char *quant_mix_name(QuantMix mix);

// The type of a tensor of this role in this mix: the published type (docs/MODEL.md 2.5) for every
// non-routed role, the mix's types for routed experts; everything F32 (tid2eid I32) for F32.
GgmlType mix_tensor_type(TensorRole role, QuantMix mix);

}  // namespace ds4::model

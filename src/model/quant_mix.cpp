#include "model/quant_mix.h"

#include <fmt/format.h>

#include "common/error.h"

namespace ds4::model {

QuantMix parse_quant_mix(const std::string &name) {
    if (name == "f32") return QuantMix::F32;
    if (name == "q8_0") return QuantMix::Q8_0;
    if (name == "q2") return QuantMix::Q2;
    if (name == "q4") return QuantMix::Q4;
    throw Error(fmt::format("unknown quant mix '{}': expected f32, q8_0, q2 or q4", name));
}

const char *quant_mix_name(QuantMix mix) {
    switch (mix) {
        case QuantMix::F32:
            return "f32";
        case QuantMix::Q8_0:
            return "q8_0";
        case QuantMix::Q2:
            return "q2";
        case QuantMix::Q4:
            return "q4";
    }
    return "?";
}

GgmlType mix_tensor_type(TensorRole role, QuantMix mix) {
    const GgmlType published = role_published_type(role);
    if (mix == QuantMix::F32) return published == GgmlType::I32 ? GgmlType::I32 : GgmlType::F32;
    switch (role) {
        case TensorRole::RoutedGateUp:
            return mix == QuantMix::Q2   ? GgmlType::IQ2_XXS
                   : mix == QuantMix::Q4 ? GgmlType::Q4_K
                                         : GgmlType::Q8_0;
        case TensorRole::RoutedDown:
            return mix == QuantMix::Q2   ? GgmlType::Q2_K
                   : mix == QuantMix::Q4 ? GgmlType::Q4_K
                                         : GgmlType::Q8_0;
        default:
            return published;
    }
}

}  // namespace ds4::model

#include "model/weights.h"

#include <fmt/format.h>

#include <cctype>
#include <set>

#include "common/error.h"
#include "model/tensor_layout.h"

namespace ds4::model {

ModelWeights ModelWeights::bind(const gguf::File &f, const HParams &hp) {
    ModelWeights w;
    w.layers.resize(hp.n_layer);
    std::set<std::string> bound;
    for_each_tensor(hp, &w, [&](const TensorSpec &spec, const gguf::TensorInfo **slot) {
        const gguf::TensorInfo *t = f.find_tensor(spec.name);
        if (!t) {
            if (spec.required)
                throw Error(fmt::format("{}: missing tensor '{}' (expected shape {})", f.path(),
                                        spec.name,
                                        gguf::TensorInfo{spec.name, spec.ne}.shape_string()));
            return;
        }
        if (!role_accepts(spec.role, t->type))
            throw Error(fmt::format("{}: tensor '{}' has type {}, expected {}", f.path(), spec.name,
                                    ggml_type_name(t->type), role_accepted_types(spec.role)));
        if (t->ne != spec.ne)
            throw Error(fmt::format("{}: tensor '{}' has shape {}, expected {}", f.path(),
                                    spec.name, t->shape_string(),
                                    gguf::TensorInfo{spec.name, spec.ne}.shape_string()));
        bound.insert(spec.name);
        *slot = t;
    });
    // A tensor outside the layout means a foreign file (or hyper-parameters that do not match it).
    for (const auto &t : f.tensors())
        if (!bound.count(t.name))
            throw Error(fmt::format(
                "{}: unexpected tensor '{}' ({} {}): not part of the deepseek4 layout for these "
                "hyper-parameters",
                f.path(), t.name, ggml_type_name(t.type), t.shape_string()));
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const LayerWeights &L = w.layers[il];
        if (L.ffn_gate_exps->type != L.ffn_up_exps->type)
            throw Error(fmt::format(
                "{}: blk.{}: routed gate ({}) and up ({}) experts must have the same type",
                f.path(), il, ggml_type_name(L.ffn_gate_exps->type),
                ggml_type_name(L.ffn_up_exps->type)));
    }
    return w;
}

namespace {

std::string layer_mix(const LayerWeights &L) {
    const GgmlType g = L.ffn_gate_exps->type, d = L.ffn_down_exps->type;
    if (g == GgmlType::IQ2_XXS && d == GgmlType::Q2_K) return "q2";
    if (g == GgmlType::Q4_K && d == GgmlType::Q4_K) return "q4";
    std::string m = g == d ? std::string(ggml_type_name(g))
                           : fmt::format("{}/{}", ggml_type_name(g), ggml_type_name(d));
    for (auto &c : m) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return m;
}

}  // namespace

std::string routed_quant_mix(const HParams &hp, const ModelWeights &w) {
    std::set<std::string> mixes;
    for (uint32_t il = 0; il < hp.n_layer; ++il) mixes.insert(layer_mix(w.layers[il]));
    if (mixes.size() == 1) return *mixes.begin();
    if (mixes == std::set<std::string>{"q2", "q4"}) return "mixed";
    std::string all;
    for (const auto &m : mixes) all += (all.empty() ? "" : "+") + m;
    return "custom (" + all + ")";
}

std::string strict_flash_mismatch(const HParams &hp, const ModelWeights &w) {
    if (std::string m = hp.flash_mismatch(); !m.empty()) return m;
    std::string first;
    ModelWeights copy = w;
    for_each_tensor(hp, &copy, [&](const TensorSpec &spec, const gguf::TensorInfo **slot) {
        const gguf::TensorInfo *t = *slot;
        if (!first.empty() || !t) return;
        if (spec.role == TensorRole::RoutedGateUp || spec.role == TensorRole::RoutedDown) {
            const std::string mix = layer_mix(copy.layers[spec.layer]);
            if (mix != "q2" && mix != "q4")
                first = fmt::format(
                    "blk.{}: routed experts are {}, the published layouts are "
                    "IQ2_XXS/Q2_K (q2) or Q4_K (q4)",
                    spec.layer, mix);
            return;
        }
        if (t->type != role_published_type(spec.role))
            first = fmt::format("tensor '{}' is {}, the published layout has {}", t->name,
                                ggml_type_name(t->type),
                                ggml_type_name(role_published_type(spec.role)));
    });
    return first;
}

}  // namespace ds4::model

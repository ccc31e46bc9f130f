#include "model/model_summary.h"

#include <fmt/format.h>

#include "model/tensor_layout.h"

namespace ds4::model {

namespace {

// docs/MODEL.md 11.1 classes; norms inside compressors count as norms.
size_t size_class(TensorRole role) {
    switch (role) {
        case TensorRole::RoutedGateUp:
        case TensorRole::RoutedDown:
            return 0;
        case TensorRole::AttnProjection:
            return 1;
        case TensorRole::SharedExpert:
            return 2;
        case TensorRole::Embedding:
            return 3;
        case TensorRole::Head:
            return 4;
        case TensorRole::Compressor:
            return 5;
        case TensorRole::IndexerProjection:
            return 6;
        case TensorRole::IndexerCompressor:
            return 7;
        case TensorRole::Router:
        case TensorRole::RouterBias:
        case TensorRole::Tid2Eid:
            return 8;
        case TensorRole::HcFn:
        case TensorRole::HcScale:
        case TensorRole::HcBase:
            return 9;
        case TensorRole::Norm:
        case TensorRole::Sinks:
            return 10;
    }
    return 10;
}

}  // namespace

std::vector<ClassBytes> bytes_by_class(const HParams &hp, const ModelWeights &w) {
    std::vector<ClassBytes> c = {
        {"routed experts"},      {"attention projections"}, {"shared experts"},
        {"token embedding"},     {"output head"},           {"attention compressors"},
        {"indexer q_b + proj"},  {"indexer compressors"},   {"router + bias + tid2eid"},
        {"HC fns/scales/bases"}, {"norms, sinks"},          {"total"}};
    ModelWeights copy = w;
    for_each_tensor(hp, &copy, [&](const TensorSpec &spec, const gguf::TensorInfo **slot) {
        if (!*slot) return;
        for (size_t i : {size_class(spec.role), c.size() - 1}) {
            c[i].bytes += (*slot)->n_bytes;
            c[i].params += (*slot)->n_elements;
        }
    });
    return c;
}

std::string layer_schedule(const HParams &hp) {
    auto kind = [&](uint32_t il) {
        std::string k;
        switch (hp.attention_kind(il)) {
            case AttentionKind::Window:
                k = "window only";
                break;
            case AttentionKind::Overlapped:
                k = fmt::format("ratio {} + indexer", hp.compress_ratio[il]);
                break;
            case AttentionKind::Compressed:
                k = fmt::format("ratio {}", hp.compress_ratio[il]);
                break;
        }
        return k + (hp.is_hash_layer(il) ? ", hash-routed" : ", top-k routed");
    };
    std::string out;
    for (uint32_t il = 0; il < hp.n_layer; ++il)
        out += fmt::format("    layer {:>2}: {}\n", il, kind(il));
    return out;
}

std::string inspect_report(const std::string &path, const HParams &hp, const ModelWeights &w) {
    std::string s = fmt::format("model: {}\n", path);
    s += fmt::format("  layout: {}\n", hp.is_flash()
                                           ? "DeepSeek V4 Flash dimensions"
                                           : "deepseek4 architecture, non-Flash dimensions");
    s += fmt::format("  routed experts: {}\n", routed_quant_mix(hp, w));
    s += fmt::format(
        "  dims: layers {}, embd {}, vocab {}, heads {} x {} (rope {}), q_lora {}, out groups {} x "
        "{}\n",
        hp.n_layer, hp.n_embd, hp.n_vocab, hp.n_head, hp.head_dim, hp.n_rot, hp.q_lora_rank,
        hp.n_out_group, hp.o_lora_rank);
    s += fmt::format("  experts: {} routed ({} used, ffn {}), {} shared, {} hash layers\n",
                     hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_expert_shared,
                     hp.n_hash_layer);
    s += fmt::format(
        "  attention: window {}, indexer {} heads x {} top-{}, HC {} streams, sinkhorn {}\n",
        hp.sliding_window, hp.n_idx_head, hp.idx_head_dim, hp.idx_top_k, hp.n_hc,
        hp.sinkhorn_iters);
    s += fmt::format(
        "  rope: base {} (window layers), {} x YaRN {} (compressed layers, orig ctx {})\n",
        hp.rope_freq_base, hp.compress_rope_freq_base, hp.rope_scaling_factor, hp.rope_orig_ctx);
    if (hp.context_length) s += fmt::format("  context length: {}\n", hp.context_length);
    s += "  layer schedule:\n" + layer_schedule(hp);
    s += "  bytes by tensor class:\n";
    for (const auto &c : bytes_by_class(hp, w))
        s += fmt::format("    {:<26} {:>16} B  {:>9.3f} GB  {:>9.3f} GiB  {:>14} params\n", c.name,
                         c.bytes, c.bytes / 1e9, c.bytes / double(1ull << 30), c.params);
    return s;
}

}  // namespace ds4::model

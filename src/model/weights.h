#pragma once
// Every tensor of a DeepSeek V4 GGUF bound by name, with its type and shape checked against the
// hyper-parameters (the layout itself is written down once, in tensor_layout.h). Tensors stay in
// the file mapping; a binding is a pointer to the tensor info. Routed-expert tensors are bound here
// for their geometry only: the runtime reads their bytes through an expert source (resident or
// streamed), never through this struct.
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "model/hparams.h"

namespace ds4::model {

using Tensor = const gguf::TensorInfo *;  // null when an optional tensor is absent

struct LayerWeights {
    // attention
    Tensor hc_attn_fn = nullptr, hc_attn_scale = nullptr, hc_attn_base = nullptr;
    Tensor attn_norm = nullptr;
    Tensor attn_q_a = nullptr, attn_q_a_norm = nullptr, attn_q_b = nullptr;
    Tensor attn_kv = nullptr, attn_kv_a_norm = nullptr;
    Tensor attn_sinks = nullptr;
    Tensor attn_output_a = nullptr, attn_output_b = nullptr;
    // compressor (ratio != 0)
    Tensor comp_ape = nullptr, comp_kv = nullptr, comp_gate = nullptr, comp_norm = nullptr;
    // indexer (ratio 4)
    Tensor idx_q_b = nullptr, idx_proj = nullptr;
    Tensor idx_comp_ape = nullptr, idx_comp_kv = nullptr, idx_comp_gate = nullptr,
           idx_comp_norm = nullptr;
    // feed-forward
    Tensor hc_ffn_fn = nullptr, hc_ffn_scale = nullptr, hc_ffn_base = nullptr;
    Tensor ffn_norm = nullptr;
    Tensor ffn_gate_inp = nullptr;
    Tensor exp_probs_b = nullptr;  // optional selection bias
    Tensor tid2eid = nullptr;      // hash layers only
    Tensor ffn_gate_exps = nullptr, ffn_up_exps = nullptr, ffn_down_exps = nullptr;
    Tensor ffn_gate_shexp = nullptr, ffn_up_shexp = nullptr, ffn_down_shexp = nullptr;
};

struct ModelWeights {
    Tensor token_embd = nullptr;
    Tensor output_hc_fn = nullptr, output_hc_scale = nullptr, output_hc_base = nullptr;
    Tensor output_norm = nullptr;
    Tensor output = nullptr;
    std::vector<LayerWeights> layers;

    // Binds and checks every tensor; throws ds4::Error naming the first missing, mistyped,
    // misshapen or unexpected tensor.
    static ModelWeights bind(const gguf::File &f, const HParams &hp);
};

// `--strict`: the file is exactly the published Flash layout (docs/MODEL.md 2.5): Flash dimensions
// and, per layer, routed experts IQ2_XXS/IQ2_XXS/Q2_K (q2) or Q4_K x3 (q4), every other tensor
// with its published type. Returns "" or the first difference.
std::string strict_flash_mismatch(const HParams &hp, const ModelWeights &w);

// "q2", "q4", "mixed" (per-layer q2/q4), or a description such as "f32" / "q8_0" / "custom".
std::string routed_quant_mix(const HParams &hp, const ModelWeights &w);

}  // namespace ds4::model

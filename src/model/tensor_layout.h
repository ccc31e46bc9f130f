#pragma once
// The deepseek4 GGUF tensor layout as data: for given hyper-parameters, every tensor's name,
// role and shape (docs/MODEL.md 2.1-2.2). Binding, the synthetic model maker and the size report all
// walk this one list, so the layout is written down exactly once.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/ggml_type.h"
#include "gguf/gguf_file.h"
#include "model/hparams.h"

namespace ds4::model {

struct ModelWeights;

enum class TensorRole {
    Embedding,          // token_embd
    HcFn,               // hc_{attn,ffn}_fn, output_hc_fn
    HcScale,            // hc_*_scale, output_hc_scale
    HcBase,             // hc_*_base, output_hc_base
    Norm,               // every RMSNorm weight
    Sinks,              // attn_sinks
    AttnProjection,     // q_a, q_b, kv, output_a, output_b
    Compressor,         // attn_compressor_{ape,kv,gate}
    IndexerProjection,  // indexer.attn_q_b, indexer.proj
    IndexerCompressor,  // indexer_compressor_{ape,kv,gate}
    Router,             // ffn_gate_inp
    RouterBias,         // exp_probs_b (optional)
    Tid2Eid,            // ffn_gate_tid2eid (hash layers)
    RoutedGateUp,       // ffn_{gate,up}_exps
    RoutedDown,         // ffn_down_exps
    SharedExpert,       // ffn_{gate,up,down}_shexp
    Head,               // output
};

struct TensorSpec {
    std::string name;
    TensorRole role;
    std::vector<uint64_t> ne;  // GGUF order: ne[0] = input features
    int layer = -1;            // -1 for global tensors
    bool required = true;
};

// Calls fn(spec, slot) for every tensor of the layout, in file order; `slot` points at the
// field of `w` that holds the tensor (null when w is null).
void for_each_tensor(const HParams &hp, ModelWeights *w,
                     const std::function<void(const TensorSpec &, const gguf::TensorInfo **)> &fn);

// Types a role accepts when binding (non-strict), and its published type (strict, and what the
// synthetic q8_0/q2/q4 mixes write); routed roles have no single published type.
bool role_accepts(TensorRole role, GgmlType type);
const char *role_accepted_types(TensorRole role);
GgmlType role_published_type(TensorRole role);

}  // namespace ds4::model

#include "model/tensor_layout.h"

#include <fmt/format.h>

#include "model/weights.h"
#include "quant/quant.h"

namespace ds4::model {

void for_each_tensor(const HParams &hp, ModelWeights *w,
                     const std::function<void(const TensorSpec &, const gguf::TensorInfo **)> &fn) {
    using R = TensorRole;
    const uint64_t E = hp.n_embd, V = hp.n_vocab, D = hp.head_dim, HC = hp.n_hc,
                   mix = hp.n_hc_mix();
    auto global = [&](const char *name, R role, std::vector<uint64_t> ne, Tensor *slot) {
        fn(TensorSpec{name, role, std::move(ne)}, w ? slot : nullptr);
    };
    global("token_embd.weight", R::Embedding, {E, V}, w ? &w->token_embd : nullptr);
    global("output_hc_fn.weight", R::HcFn, {HC * E, HC}, w ? &w->output_hc_fn : nullptr);
    global("output_hc_scale.weight", R::HcScale, {1}, w ? &w->output_hc_scale : nullptr);
    global("output_hc_base.weight", R::HcBase, {HC}, w ? &w->output_hc_base : nullptr);
    global("output_norm.weight", R::Norm, {E}, w ? &w->output_norm : nullptr);
    global("output.weight", R::Head, {E, V}, w ? &w->output : nullptr);

    const uint64_t heads_per_group = hp.n_head / hp.n_out_group;
    const uint64_t F = hp.n_ff_exp, X = hp.n_expert, FS = F * hp.n_expert_shared;
    const uint64_t I = hp.idx_head_dim, Q = hp.q_lora_rank, G = hp.n_out_group;
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        LayerWeights *L = w ? &w->layers.at(il) : nullptr;
        auto t = [&](const char *suffix, R role, std::vector<uint64_t> ne,
                     Tensor LayerWeights::*field, bool required = true) {
            fn(TensorSpec{fmt::format("blk.{}.{}", il, suffix), role, std::move(ne), int(il),
                          required},
               L ? &(L->*field) : nullptr);
        };
        using LW = LayerWeights;
        t("hc_attn_fn.weight", R::HcFn, {HC * E, mix}, &LW::hc_attn_fn);
        t("hc_attn_scale.weight", R::HcScale, {3}, &LW::hc_attn_scale);
        t("hc_attn_base.weight", R::HcBase, {mix}, &LW::hc_attn_base);
        t("attn_norm.weight", R::Norm, {E}, &LW::attn_norm);
        t("attn_q_a.weight", R::AttnProjection, {E, Q}, &LW::attn_q_a);
        t("attn_q_a_norm.weight", R::Norm, {Q}, &LW::attn_q_a_norm);
        t("attn_q_b.weight", R::AttnProjection, {Q, hp.n_head * D}, &LW::attn_q_b);
        t("attn_kv.weight", R::AttnProjection, {E, D}, &LW::attn_kv);
        t("attn_kv_a_norm.weight", R::Norm, {D}, &LW::attn_kv_a_norm);
        t("attn_sinks.weight", R::Sinks, {hp.n_head}, &LW::attn_sinks);
        t("attn_output_a.weight", R::AttnProjection, {heads_per_group * D, G * hp.o_lora_rank},
          &LW::attn_output_a);
        t("attn_output_b.weight", R::AttnProjection, {G * hp.o_lora_rank, E}, &LW::attn_output_b);
        const uint64_t ratio = hp.compress_ratio[il];
        if (ratio != 0) {
            const uint64_t coff = hp.compressor_coff(il);
            t("attn_compressor_ape.weight", R::Compressor, {D * coff, ratio}, &LW::comp_ape);
            t("attn_compressor_kv.weight", R::Compressor, {E, D * coff}, &LW::comp_kv);
            t("attn_compressor_gate.weight", R::Compressor, {E, D * coff}, &LW::comp_gate);
            t("attn_compressor_norm.weight", R::Norm, {D}, &LW::comp_norm);
        }
        if (hp.attention_kind(il) == AttentionKind::Overlapped) {
            t("indexer.attn_q_b.weight", R::IndexerProjection, {Q, hp.n_idx_head * I},
              &LW::idx_q_b);
            t("indexer.proj.weight", R::IndexerProjection, {E, hp.n_idx_head}, &LW::idx_proj);
            t("indexer_compressor_ape.weight", R::IndexerCompressor, {I * 2, ratio},
              &LW::idx_comp_ape);
            t("indexer_compressor_kv.weight", R::IndexerCompressor, {E, I * 2}, &LW::idx_comp_kv);
            t("indexer_compressor_gate.weight", R::IndexerCompressor, {E, I * 2},
              &LW::idx_comp_gate);
            t("indexer_compressor_norm.weight", R::Norm, {I}, &LW::idx_comp_norm);
        }
        t("hc_ffn_fn.weight", R::HcFn, {HC * E, mix}, &LW::hc_ffn_fn);
        t("hc_ffn_scale.weight", R::HcScale, {3}, &LW::hc_ffn_scale);
        t("hc_ffn_base.weight", R::HcBase, {mix}, &LW::hc_ffn_base);
        t("ffn_norm.weight", R::Norm, {E}, &LW::ffn_norm);
        t("ffn_gate_inp.weight", R::Router, {E, X}, &LW::ffn_gate_inp);
        // The official gate has no bias on hash layers (docs/MODEL.md 12.5); either is accepted.
        t("exp_probs_b.bias", R::RouterBias, {X}, &LW::exp_probs_b, false);
        if (hp.is_hash_layer(il))
            t("ffn_gate_tid2eid.weight", R::Tid2Eid, {hp.n_expert_used, V}, &LW::tid2eid);
        t("ffn_gate_exps.weight", R::RoutedGateUp, {E, F, X}, &LW::ffn_gate_exps);
        t("ffn_up_exps.weight", R::RoutedGateUp, {E, F, X}, &LW::ffn_up_exps);
        t("ffn_down_exps.weight", R::RoutedDown, {F, E, X}, &LW::ffn_down_exps);
        t("ffn_gate_shexp.weight", R::SharedExpert, {E, FS}, &LW::ffn_gate_shexp);
        t("ffn_up_shexp.weight", R::SharedExpert, {E, FS}, &LW::ffn_up_shexp);
        t("ffn_down_shexp.weight", R::SharedExpert, {FS, E}, &LW::ffn_down_shexp);
    }
}

namespace {

enum class TypeClass { F32Only, Float, Matrix, I32 };

TypeClass role_class(TensorRole role) {
    switch (role) {
        case TensorRole::HcScale:
        case TensorRole::HcBase:
        case TensorRole::Norm:
        case TensorRole::Sinks:
        case TensorRole::RouterBias:
            return TypeClass::F32Only;
        case TensorRole::Embedding:
        case TensorRole::HcFn:
        case TensorRole::Compressor:
        case TensorRole::IndexerProjection:
        case TensorRole::IndexerCompressor:
        case TensorRole::Router:
            return TypeClass::Float;
        case TensorRole::Tid2Eid:
            return TypeClass::I32;
        case TensorRole::AttnProjection:
        case TensorRole::RoutedGateUp:
        case TensorRole::RoutedDown:
        case TensorRole::SharedExpert:
        case TensorRole::Head:
            return TypeClass::Matrix;
    }
    return TypeClass::Matrix;
}

}  // namespace

bool role_accepts(TensorRole role, GgmlType t) {
    switch (role_class(role)) {
        case TypeClass::F32Only:
            return t == GgmlType::F32;
        case TypeClass::Float:
            return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
        case TypeClass::Matrix:
            return quant::is_supported(t) && t != GgmlType::Q8_K;
        case TypeClass::I32:
            return t == GgmlType::I32;
    }
    return false;
}

const char *role_accepted_types(TensorRole role) {
    switch (role_class(role)) {
        case TypeClass::F32Only:
            return "F32";
        case TypeClass::Float:
            return "F32, F16 or BF16";
        case TypeClass::Matrix:
            return "a supported matrix format (F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS, MXFP4)";
        case TypeClass::I32:
            return "I32";
    }
    return "?";
}

GgmlType role_published_type(TensorRole role) {
    switch (role_class(role)) {
        case TypeClass::F32Only:
            return GgmlType::F32;
        case TypeClass::Float:
            return GgmlType::F16;
        case TypeClass::I32:
            return GgmlType::I32;
        case TypeClass::Matrix:
            return GgmlType::Q8_0;  // routed roles: see the quant mix
    }
    return GgmlType::F32;
}

}  // namespace ds4::model

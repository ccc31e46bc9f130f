#include "model/hparams.h"

#include <fmt/format.h>

#include <cmath>

#include "common/error.h"
#include "gguf/gguf_file.h"

namespace ds4::model {
namespace {

constexpr const char *kPrefix = "deepseek4.";

std::string key(const char *name) {
    return std::string(kPrefix) + name;
}

void check(bool ok, const std::string &what) {
    if (!ok) throw Error("inconsistent deepseek4 hyper-parameters: " + what);
}

}  // namespace

HParams HParams::from_gguf(const gguf::File &f) {
    const std::string arch = f.get_string_or("general.architecture", "");
    if (arch != "deepseek4")
        throw Error(fmt::format("{}: general.architecture is '{}', expected 'deepseek4'", f.path(),
                                arch.empty() ? "(missing)" : arch));
    HParams h;
    auto u32 = [&](const char *name) { return f.get_u32(key(name)); };
    auto num = [&](const char *name) { return static_cast<float>(f.get_f64(key(name))); };
    h.n_layer = u32("block_count");
    h.n_embd = u32("embedding_length");
    h.n_vocab = u32("vocab_size");
    h.n_head = u32("attention.head_count");
    h.n_head_kv = u32("attention.head_count_kv");
    h.head_dim = u32("attention.key_length");
    const uint32_t value_length = u32("attention.value_length");
    h.n_rot = u32("rope.dimension_count");
    h.q_lora_rank = u32("attention.q_lora_rank");
    h.o_lora_rank = u32("attention.output_lora_rank");
    h.n_out_group = u32("attention.output_group_count");
    h.n_expert = u32("expert_count");
    h.n_expert_used = u32("expert_used_count");
    h.n_ff_exp = u32("expert_feed_forward_length");
    h.n_expert_shared = u32("expert_shared_count");
    h.n_hash_layer = u32("hash_layer_count");
    h.n_expert_group = f.get_u32_or(key("expert_group_count"), 0);
    h.n_expert_group_used = f.get_u32_or(key("expert_group_used_count"), 0);
    h.sliding_window = u32("attention.sliding_window");
    h.n_idx_head = u32("attention.indexer.head_count");
    h.idx_head_dim = u32("attention.indexer.key_length");
    h.idx_top_k = u32("attention.indexer.top_k");
    h.n_hc = u32("hyper_connection.count");
    h.sinkhorn_iters = u32("hyper_connection.sinkhorn_iterations");
    h.rope_orig_ctx = f.get_u64(key("rope.scaling.original_context_length"));
    h.rope_freq_base = num("rope.freq_base");
    h.rope_scaling_factor = num("rope.scaling.factor");
    h.yarn_beta_fast = num("rope.scaling.yarn_beta_fast");
    h.yarn_beta_slow = num("rope.scaling.yarn_beta_slow");
    h.compress_rope_freq_base = num("attention.compress_rope_freq_base");
    h.expert_weights_scale = num("expert_weights_scale");
    h.rms_eps = num("attention.layer_norm_rms_epsilon");
    h.hc_eps = num("hyper_connection.epsilon");
    h.expert_weights_norm = f.get_bool(key("expert_weights_norm"));
    if (const gguf::Value *v = f.find(key("context_length")); v && v->is_integer())
        h.context_length = v->as_unsigned();

    const auto ratios = f.get_int_array(key("attention.compress_ratios"));
    const auto clamps = f.get_float_array(key("swiglu_clamp_exp"));
    if (ratios.size() < h.n_layer)
        throw Error(fmt::format("{}: {} has {} entries, the model has {} layers", f.path(),
                                key("attention.compress_ratios"), ratios.size(), h.n_layer));
    if (clamps.size() < h.n_layer)
        throw Error(fmt::format("{}: {} has {} entries, the model has {} layers", f.path(),
                                key("swiglu_clamp_exp"), clamps.size(), h.n_layer));
    for (uint32_t il = 0; il < h.n_layer; ++il) {
        if (ratios[il] < 0 || ratios[il] == 1 || ratios[il] > (1 << 20))
            throw Error(fmt::format("{}: {}[{}] = {}: a ratio is 0 (no compression) or 2..2^20",
                                    f.path(), key("attention.compress_ratios"), il, ratios[il]));
        h.compress_ratio.push_back(static_cast<uint32_t>(ratios[il]));
        h.swiglu_clamp.push_back(static_cast<float>(clamps[il]));
    }

    try {
        check(h.n_layer > 0 && h.n_embd > 0 && h.n_vocab > 0 && h.n_head > 0, "zero dimension");
        check(h.n_head_kv == 1,
              fmt::format("head_count_kv is {}, this architecture has one shared KV head",
                          h.n_head_kv));
        check(value_length == h.head_dim,
              fmt::format("value_length {} != key_length {} (K and V are the same vector)",
                          value_length, h.head_dim));
        check(h.n_rot > 0 && h.n_rot % 2 == 0 && h.n_rot <= h.head_dim,
              fmt::format("rope.dimension_count {} must be even and <= key_length {}", h.n_rot,
                          h.head_dim));
        check(h.n_out_group > 0 && h.n_head % h.n_out_group == 0,
              fmt::format("head_count {} is not a multiple of output_group_count {}", h.n_head,
                          h.n_out_group));
        check(h.n_expert > 0 && h.n_expert_used > 0 && h.n_expert_used <= h.n_expert,
              fmt::format("expert_used_count {} must be in 1..expert_count {}", h.n_expert_used,
                          h.n_expert));
        check(h.n_hash_layer <= h.n_layer,
              fmt::format("hash_layer_count {} > block_count {}", h.n_hash_layer, h.n_layer));
        check(h.n_expert_group == 0,
              "group-limited routing (expert_group_count > 0) is not part of this architecture");
        check(h.sliding_window > 0, "sliding_window is 0");
        check(h.n_hc > 0 && h.sinkhorn_iters > 0,
              "hyper_connection.count and sinkhorn_iterations must be > 0");
        check(h.rms_eps > 0 && h.hc_eps > 0, "epsilons must be > 0");
        bool any_overlap = false;
        for (uint32_t r : h.compress_ratio) any_overlap |= (r == kOverlapRatio);
        if (any_overlap) {
            check(h.n_idx_head > 0 && h.idx_top_k > 0,
                  "indexer head_count and top_k must be > 0 when ratio-4 layers exist");
            check(h.idx_head_dim >= h.n_rot && h.idx_head_dim % 2 == 0,
                  fmt::format("indexer key_length {} must be even and >= the rope dims {}",
                              h.idx_head_dim, h.n_rot));
        }
    } catch (const Error &e) {
        throw Error(fmt::format("{}: {}", f.path(), e.what()));
    }
    return h;
}

AttentionKind HParams::attention_kind(uint32_t il) const {
    const uint32_t r = compress_ratio.at(il);
    if (r == 0) return AttentionKind::Window;
    return r == kOverlapRatio ? AttentionKind::Overlapped : AttentionKind::Compressed;
}

std::string HParams::flash_mismatch() const {
    auto ne = [](const char *what, uint64_t got, uint64_t want) -> std::string {
        return got == want ? "" : fmt::format("{} is {}, Flash has {}", what, got, want);
    };
    for (auto m : {ne("block_count", n_layer, 43),
                   ne("embedding_length", n_embd, 4096),
                   ne("vocab_size", n_vocab, 129280),
                   ne("head_count", n_head, 64),
                   ne("key_length", head_dim, 512),
                   ne("rope dims", n_rot, 64),
                   ne("q_lora_rank", q_lora_rank, 1024),
                   ne("output_lora_rank", o_lora_rank, 1024),
                   ne("output_group_count", n_out_group, 8),
                   ne("expert_count", n_expert, 256),
                   ne("expert_used_count", n_expert_used, 6),
                   ne("expert_feed_forward_length", n_ff_exp, 2048),
                   ne("expert_shared_count", n_expert_shared, 1),
                   ne("hash_layer_count", n_hash_layer, 3),
                   ne("sliding_window", sliding_window, 128),
                   ne("indexer head_count", n_idx_head, 64),
                   ne("indexer key_length", idx_head_dim, 128),
                   ne("indexer top_k", idx_top_k, 512),
                   ne("hyper_connection.count", n_hc, 4),
                   ne("sinkhorn_iterations", sinkhorn_iters, 20)})
        if (!m.empty()) return m;
    for (uint32_t il = 0; il < n_layer; ++il) {
        const uint32_t want = il < 2 ? 0 : (il % 2 == 0 ? 4 : 128);
        if (compress_ratio[il] != want)
            return fmt::format("compress_ratios[{}] is {}, Flash has {}", il, compress_ratio[il],
                               want);
        if (swiglu_clamp[il] != 10.0f)
            return fmt::format("swiglu_clamp_exp[{}] is {}, Flash has 10", il, swiglu_clamp[il]);
    }
    auto close = [](float got, double want) {
        return std::fabs(got - want) <= std::max(1.0, std::fabs(want)) * 1e-6;
    };
    if (!close(rope_freq_base, 10000))
        return fmt::format("rope.freq_base is {}, Flash has 10000", rope_freq_base);
    if (!close(compress_rope_freq_base, 160000))
        return fmt::format("compress_rope_freq_base is {}, Flash has 160000",
                           compress_rope_freq_base);
    if (!close(rope_scaling_factor, 16))
        return fmt::format("rope.scaling.factor is {}, Flash has 16", rope_scaling_factor);
    if (rope_orig_ctx != 65536)
        return fmt::format("rope original context is {}, Flash has 65536", rope_orig_ctx);
    if (!close(yarn_beta_fast, 32) || !close(yarn_beta_slow, 1))
        return "YaRN betas differ from Flash (32, 1)";
    if (!close(expert_weights_scale, 1.5))
        return fmt::format("expert_weights_scale is {}, Flash has 1.5", expert_weights_scale);
    if (!close(rms_eps, 1e-6) || !close(hc_eps, 1e-6)) return "epsilons differ from Flash (1e-6)";
    if (!expert_weights_norm) return "expert_weights_norm is false, Flash normalises";
    return "";
}

bool HParams::is_flash() const {
    return flash_mismatch().empty();
}

}  // namespace ds4::model

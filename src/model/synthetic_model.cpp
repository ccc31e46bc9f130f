#include "model/synthetic_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <thread>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/tensor_layout.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace ds4::model {

namespace {

// The published Flash values (docs/MODEL.md 1.2, 3).
HParams flash(uint32_t n_vocab) {
    HParams h;
    h.n_layer = 43;
    h.n_embd = 4096;
    h.n_vocab = n_vocab;
    h.n_head = 64;
    h.n_head_kv = 1;
    h.head_dim = 512;
    h.n_rot = 64;
    h.q_lora_rank = 1024;
    h.o_lora_rank = 1024;
    h.n_out_group = 8;
    h.n_expert = 256;
    h.n_expert_used = 6;
    h.n_ff_exp = 2048;
    h.n_expert_shared = 1;
    h.n_hash_layer = 3;
    h.sliding_window = 128;
    h.n_idx_head = 64;
    h.idx_head_dim = 128;
    h.idx_top_k = 512;
    h.n_hc = 4;
    h.sinkhorn_iters = 20;
    for (uint32_t il = 0; il < h.n_layer; ++il) {
        h.compress_ratio.push_back(il < 2 ? 0 : (il % 2 == 0 ? 4 : 128));
        h.swiglu_clamp.push_back(10.0f);
    }
    h.rope_orig_ctx = 65536;
    h.rope_freq_base = 10000;
    h.rope_scaling_factor = 16;
    h.yarn_beta_fast = 32;
    h.yarn_beta_slow = 1;
    h.compress_rope_freq_base = 160000;
    h.expert_weights_scale = 1.5f;
    h.rms_eps = 1e-6f;
    h.hc_eps = 1e-6f;
    h.expert_weights_norm = true;
    h.context_length = 1048576;
    return h;
}

// Small widths, Flash structure, scaled-down ratios (4 and 16) and window (8) so that prompts of a
// few dozen tokens cross every boundary; the indexer selects (top-k 4) from the 5th compressed row.
// The embedding and expert widths are 256, the smallest that the 256-value K-quant and IQ2 blocks
// of the q2/q4 mixes allow.
HParams tiny(uint32_t n_vocab) {
    HParams h = flash(n_vocab);
    h.n_layer = 6;
    h.n_embd = 256;
    h.n_head = 4;
    h.head_dim = 64;
    h.n_rot = 16;
    h.q_lora_rank = 32;
    h.o_lora_rank = 32;
    h.n_out_group = 2;
    h.n_expert = 8;
    h.n_expert_used = 2;
    h.n_ff_exp = 256;
    h.n_hash_layer = 3;
    h.sliding_window = 8;
    h.n_idx_head = 4;
    h.idx_head_dim = 32;
    h.idx_top_k = 4;
    h.compress_ratio = {0, 0, 4, 16, 4, 16};
    h.swiglu_clamp.assign(h.n_layer, 10.0f);
    h.context_length = 4096;
    return h;
}

// Flash widths and routed-expert sizes, 6 layers (every kind once or twice) and 32 experts: a
// few GB in q2, for speed work on one machine.
HParams small(uint32_t n_vocab) {
    HParams h = flash(n_vocab);
    h.n_layer = 6;
    h.n_expert = 32;
    h.compress_ratio = {0, 0, 4, 128, 4, 128};
    h.swiglu_clamp.assign(h.n_layer, 10.0f);
    return h;
}

}  // namespace

HParams shape_preset(const std::string &name, uint32_t n_vocab) {
    if (name == "tiny") return tiny(n_vocab);
    if (name == "small") return small(n_vocab);
    if (name == "flash") return flash(n_vocab);
    throw Error(
        fmt::format("unknown shape '{}': expected tiny, small, flash or a JSON file", name));
}

HParams shape_from_json(const std::string &json_text, uint32_t n_vocab) {
    HParams h = tiny(n_vocab);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(json_text);
    } catch (const nlohmann::json::exception &e) {
        throw Error(fmt::format("shape JSON: {}", e.what()));
    }
    if (!j.is_object()) throw Error("shape JSON: expected an object of hyper-parameter fields");
    auto u32 = [&](const char *k, uint32_t &dst) {
        if (j.contains(k)) dst = j.at(k).get<uint32_t>();
    };
    try {
        for (auto &[k, v] : j.items()) {
            static const char *known[] = {
                "n_layer",         "n_embd",       "n_vocab",        "n_head",
                "head_dim",        "n_rot",        "q_lora_rank",    "o_lora_rank",
                "n_out_group",     "n_expert",     "n_expert_used",  "n_ff_exp",
                "n_expert_shared", "n_hash_layer", "sliding_window", "n_idx_head",
                "idx_head_dim",    "idx_top_k",    "n_hc",           "sinkhorn_iters",
                "compress_ratio",  "swiglu_clamp"};
            if (std::find_if(std::begin(known), std::end(known),
                             [&](const char *n) { return k == n; }) == std::end(known))
                throw Error(fmt::format("shape JSON: unknown field '{}'", k));
            (void)v;
        }
        u32("n_layer", h.n_layer);
        u32("n_embd", h.n_embd);
        u32("n_vocab", h.n_vocab);
        u32("n_head", h.n_head);
        u32("head_dim", h.head_dim);
        u32("n_rot", h.n_rot);
        u32("q_lora_rank", h.q_lora_rank);
        u32("o_lora_rank", h.o_lora_rank);
        u32("n_out_group", h.n_out_group);
        u32("n_expert", h.n_expert);
        u32("n_expert_used", h.n_expert_used);
        u32("n_ff_exp", h.n_ff_exp);
        u32("n_expert_shared", h.n_expert_shared);
        u32("n_hash_layer", h.n_hash_layer);
        u32("sliding_window", h.sliding_window);
        u32("n_idx_head", h.n_idx_head);
        u32("idx_head_dim", h.idx_head_dim);
        u32("idx_top_k", h.idx_top_k);
        u32("n_hc", h.n_hc);
        u32("sinkhorn_iters", h.sinkhorn_iters);
        if (j.contains("compress_ratio"))
            h.compress_ratio = j.at("compress_ratio").get<std::vector<uint32_t>>();
        if (j.contains("swiglu_clamp"))
            h.swiglu_clamp = j.at("swiglu_clamp").get<std::vector<float>>();
    } catch (const nlohmann::json::exception &e) {
        throw Error(fmt::format("shape JSON: {}", e.what()));
    }
    if (h.compress_ratio.size() != h.n_layer) h.compress_ratio.resize(h.n_layer, 0);
    if (h.swiglu_clamp.size() != h.n_layer) h.swiglu_clamp.resize(h.n_layer, 10.0f);
    return h;
}

namespace {

void set_metadata(gguf::Writer &w, const HParams &h, const std::string &name) {
    using gguf::Value;
    auto u32 = [&](const char *k, uint32_t v) {
        w.set(std::string("deepseek4.") + k, Value::u32(v));
    };
    auto f32 = [&](const char *k, float v) { w.set(std::string("deepseek4.") + k, Value::f32(v)); };
    w.set("general.architecture", Value::string("deepseek4"));
    w.set("general.name", Value::string(name));
    // u32, as llama.cpp reads it (ds4 itself only prints it).
    w.set("deepseek4.context_length", Value::u32(static_cast<uint32_t>(h.context_length)));
    u32("block_count", h.n_layer);
    u32("embedding_length", h.n_embd);
    u32("vocab_size", h.n_vocab);
    u32("attention.head_count", h.n_head);
    u32("attention.head_count_kv", h.n_head_kv);
    u32("attention.key_length", h.head_dim);
    u32("attention.value_length", h.head_dim);
    u32("rope.dimension_count", h.n_rot);
    u32("attention.q_lora_rank", h.q_lora_rank);
    u32("attention.output_lora_rank", h.o_lora_rank);
    u32("attention.output_group_count", h.n_out_group);
    u32("expert_count", h.n_expert);
    u32("expert_used_count", h.n_expert_used);
    u32("expert_feed_forward_length", h.n_ff_exp);
    u32("expert_shared_count", h.n_expert_shared);
    u32("hash_layer_count", h.n_hash_layer);
    u32("attention.sliding_window", h.sliding_window);
    u32("attention.indexer.head_count", h.n_idx_head);
    u32("attention.indexer.key_length", h.idx_head_dim);
    u32("attention.indexer.top_k", h.idx_top_k);
    u32("hyper_connection.count", h.n_hc);
    u32("hyper_connection.sinkhorn_iterations", h.sinkhorn_iters);
    w.set("deepseek4.attention.compress_ratios", Value::array_of_u32(h.compress_ratio));
    w.set("deepseek4.swiglu_clamp_exp", Value::array_of_f32(h.swiglu_clamp));
    w.set("deepseek4.rope.scaling.original_context_length",
          Value::u32(static_cast<uint32_t>(h.rope_orig_ctx)));
    f32("rope.freq_base", h.rope_freq_base);
    f32("rope.scaling.factor", h.rope_scaling_factor);
    f32("rope.scaling.yarn_beta_fast", h.yarn_beta_fast);
    f32("rope.scaling.yarn_beta_slow", h.yarn_beta_slow);
    f32("attention.compress_rope_freq_base", h.compress_rope_freq_base);
    f32("expert_weights_scale", h.expert_weights_scale);
    f32("attention.layer_norm_rms_epsilon", h.rms_eps);
    f32("hyper_connection.epsilon", h.hc_eps);
    w.set("deepseek4.expert_weights_norm", gguf::Value::boolean(h.expert_weights_norm));
    // Keys ds4 never reads but llama.cpp's deepseek4 loader needs, with the values the published
    // files carry (written by the llama.cpp-style converter; docs/LLAMACPP.md):
    //  - expert_gating_func: the router score function, LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS
    //    (= 4, sqrt(softplus(logit))); llama.cpp refuses any other value for deepseek4.
    //  - rope.scaling.type: "yarn". Without it llama.cpp falls back to "linear" scaling and would
    //    divide the compressed layers' positions by rope.scaling.factor instead of applying YaRN.
    u32("expert_gating_func", 4);
    w.set("deepseek4.rope.scaling.type", Value::string("yarn"));
}

// Uniform values of about this magnitude keep each output O(1): for a matrix, sqrt(3/K) gives
// outputs of variance ~1 for unit inputs.
float magnitude_for(const TensorSpec &s) {
    switch (s.role) {
        case TensorRole::Embedding:
            return 1.0f;
        case TensorRole::HcScale:
            return 0.5f;
        case TensorRole::HcBase:
        case TensorRole::RouterBias:
            return 0.1f;
        case TensorRole::Norm:
            return 0.2f;  // added to 1 below
        case TensorRole::Sinks:
            return 1.0f;
        default:
            return std::sqrt(3.0f / static_cast<float>(s.ne[0]));
    }
}

uint64_t name_seed(uint64_t seed, const std::string &name) {
    uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a over the name, keyed by the seed
    for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
    return h;
}

void fill_tensor(const TensorSpec &s, GgmlType type, const HParams &hp, uint64_t seed, uint8_t *dst,
                 size_t n_bytes) {
    uint64_t n = 1;
    for (uint64_t d : s.ne) n *= d;
    const uint64_t ts = name_seed(seed, s.name);
    if (s.role == TensorRole::Tid2Eid) {
        // Each token routes to n_expert_used distinct experts.
        std::mt19937_64 rng(ts);
        std::vector<int32_t> perm(hp.n_expert);
        auto *out = reinterpret_cast<int32_t *>(dst);
        for (uint64_t t = 0; t < s.ne[1]; ++t) {
            std::iota(perm.begin(), perm.end(), 0);
            for (uint32_t i = 0; i < hp.n_expert_used; ++i) {
                std::swap(perm[i], perm[i + rng() % (hp.n_expert - i)]);
                out[t * hp.n_expert_used + i] = perm[i];
            }
        }
        return;
    }
    const float mag = magnitude_for(s);
    if (type == GgmlType::F32 && s.role == TensorRole::Norm) {
        quant::fill_random_blocks(GgmlType::F32, dst, static_cast<int64_t>(n), ts, mag);
        auto *f = reinterpret_cast<float *>(dst);
        for (uint64_t i = 0; i < n; ++i) f[i] += 1.0f;
        return;
    }
    if (n_bytes != quant::row_size(type, static_cast<int64_t>(n)))
        throw Error(fmt::format("internal: {} byte count mismatch", s.name));
    quant::fill_random_blocks(type, dst, static_cast<int64_t>(n), ts, mag);
}

}  // namespace

void write_synthetic_model(const HParams &hp, QuantMix mix, uint64_t seed, const gguf::File &vocab,
                           const std::string &out_path, bool progress) {
    gguf::Writer w;
    set_metadata(w, hp, fmt::format("ds4cpp synthetic {} seed {}", quant_mix_name(mix), seed));
    size_t n_tokens = 0;
    for (const auto &[key, value] : vocab.metadata()) {
        if (key.rfind("tokenizer.", 0) != 0) continue;
        if (key == "tokenizer.ggml.tokens") n_tokens = value.as_array().items.size();
        w.set(key, value);
    }
    if (n_tokens == 0)
        throw Error(
            fmt::format("{}: no tokenizer.ggml.tokens: not a vocabulary GGUF", vocab.path()));
    if (n_tokens > hp.n_vocab)
        throw Error(fmt::format("vocabulary of {} tokens does not fit a model with vocab_size {}",
                                n_tokens, hp.n_vocab));

    uint64_t total = 0;
    size_t n_tensors = 0;
    for_each_tensor(hp, nullptr, [&](const TensorSpec &s, const gguf::TensorInfo **) {
        // Hash layers of the official model have no selection bias; the others do.
        if (s.role == TensorRole::RouterBias && hp.is_hash_layer(static_cast<uint32_t>(s.layer)))
            return;
        const GgmlType type = mix_tensor_type(s.role, mix);
        const uint64_t bytes = gguf::tensor_n_bytes(type, s.ne);
        total += bytes;
        ++n_tensors;
        w.add_tensor_lazy(s.name, type, s.ne,
                          [s, type, &hp, seed, progress, total, n_tensors](uint8_t *dst, size_t n) {
                              fill_tensor(s, type, hp, seed, dst, n);
                              if (progress && n >= (64u << 20))
                                  fmt::print(stderr, "mkmodel: {} ({:.2f} GB written so far)\n",
                                             s.name, total / 1e9);
                          });
    });
    if (progress)
        fmt::print(stderr, "mkmodel: writing {} tensors, {:.3f} GB, to {}\n", n_tensors,
                   total / 1e9, out_path);
    // Each fill draws from its own generator: tensors can be filled on every core at once.
    w.write(out_path, std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
}

}  // namespace ds4::model

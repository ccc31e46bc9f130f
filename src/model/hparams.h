#pragma once
// DeepSeek V4 hyper-parameters, read from the `deepseek4.*` metadata of a GGUF file. Nothing is
// hard-coded: a tiny model of the same architecture loads through the same path as Flash. The
// values are validated for self-consistency; `is_flash()` recognises the published dimensions.
#include <cstdint>
#include <string>
#include <vector>

namespace ds4::gguf {
class File;
}

namespace ds4::model {

// What a layer does with its attention history (docs/MODEL.md 3).
enum class AttentionKind {
    Window,      // ratio 0: the raw sliding window only
    Overlapped,  // ratio 4: overlapping compressor + indexer top-k over compressed rows
    Compressed,  // any other ratio (128 in Flash): plain compressor, all compressed rows
};

struct HParams {
    uint32_t n_layer = 0;
    uint32_t n_embd = 0;     // E
    uint32_t n_vocab = 0;    // V
    uint32_t n_head = 0;     // H query heads
    uint32_t n_head_kv = 0;  // 1: one shared KV head (MQA)
    uint32_t head_dim = 0;   // D = key_length = value_length
    uint32_t n_rot = 0;      // rotary tail dims per head
    uint32_t q_lora_rank = 0;
    uint32_t o_lora_rank = 0;  // per output group
    uint32_t n_out_group = 0;
    uint32_t n_expert = 0;
    uint32_t n_expert_used = 0;
    uint32_t n_ff_exp = 0;  // routed and shared expert hidden width
    uint32_t n_expert_shared = 0;
    uint32_t n_hash_layer = 0;    // layers [0, n_hash_layer) route by token id
    uint32_t n_expert_group = 0;  // 0: no group-limited routing
    uint32_t n_expert_group_used = 0;
    uint32_t sliding_window = 0;  // raw rows visible, including the current token
    uint32_t n_idx_head = 0;
    uint32_t idx_head_dim = 0;
    uint32_t idx_top_k = 0;
    uint32_t n_hc = 0;  // hyper-connection streams
    uint32_t sinkhorn_iters = 0;
    std::vector<uint32_t> compress_ratio;  // per layer, 0 = none
    std::vector<float> swiglu_clamp;       // per layer
    uint64_t rope_orig_ctx = 0;
    float rope_freq_base = 0;       // ratio-0 layers
    float rope_scaling_factor = 0;  // YaRN factor, compressed layers
    float yarn_beta_fast = 0;
    float yarn_beta_slow = 0;
    float compress_rope_freq_base = 0;
    float expert_weights_scale = 0;
    float rms_eps = 0;
    float hc_eps = 0;
    bool expert_weights_norm = true;
    uint64_t context_length = 0;  // 0 when the file does not say

    // Reads and validates; throws ds4::Error naming the key and the problem.
    static HParams from_gguf(const gguf::File &f);

    AttentionKind attention_kind(uint32_t il) const;
    bool is_hash_layer(uint32_t il) const { return il < n_hash_layer; }
    // Column multiplier of a compressor: 2 for the overlapping ratio-4 compressor, else 1.
    uint32_t compressor_coff(uint32_t il) const {
        return attention_kind(il) == AttentionKind::Overlapped ? 2 : 1;
    }
    uint32_t n_hc_mix() const { return (2 + n_hc) * n_hc; }  // pre + post + comb
    uint32_t n_nope() const { return head_dim - n_rot; }

    // True when every dimension equals the published DeepSeek V4 Flash model.
    bool is_flash() const;
    // A first mismatch against Flash, for `--strict` errors ("" when it is Flash).
    std::string flash_mismatch() const;
};

// The ratio at which a layer's compressor overlaps windows and the indexer runs (docs/MODEL.md 4.4).
constexpr uint32_t kOverlapRatio = 4;

}  // namespace ds4::model

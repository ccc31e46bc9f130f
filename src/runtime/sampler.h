#pragma once
// Next-token selection from logits (docs/MODEL.md 7.4, docs/SURFACES.md 1): greedy at temperature 0
// (first maximal index); otherwise top-k (capped at 1024) pre-selects the best logits, min-p keeps
// the candidates whose probability after temperature is at least min_p x the top one's, top-p keeps
// the smallest prefix of those survivors (sorted, renormalized) whose mass reaches top_p, and an
// xorshift64* generator seeded by the user draws from what is left. Also the log-probabilities
// of the top tokens.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ds4::runtime {

struct SamplerParams {
    float temperature = 1.0f;  // 0 = greedy
    float top_p = 1.0f;        // 1 = off
    float min_p = 0.05f;       // relative to the top token's probability; 0 = off
    int top_k = 0;             // 0 = off
    uint64_t seed = 0;         // 0 = seed from the clock
};

class Sampler {
  public:
    explicit Sampler(const SamplerParams &params);
    int32_t sample(const std::vector<float> &logits);
    const SamplerParams &params() const { return params_; }

    static constexpr size_t kMaxTopK = 1024;

  private:
    struct Candidate {
        int32_t id;
        double weight;  // exp((logit - max) / T)
    };
    uint64_t next_random();  // xorshift64*
    SamplerParams params_;
    uint64_t state_;
    std::vector<int32_t> ids_;  // scratch, reused between calls
    std::vector<Candidate> survivors_;
};

int32_t argmax(const std::vector<float> &logits);

// The k most likely tokens with their log-softmax values (over the full vocabulary, at
// temperature 1), most likely first; ties go to the lower id.
std::vector<std::pair<int32_t, float>> top_logprobs(const std::vector<float> &logits, int k);

}  // namespace ds4::runtime

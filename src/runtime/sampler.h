#pragma once
// Next-token selection from logits (MODEL.md 7.4): greedy at temperature 0 (first maximal
// index), otherwise temperature, then top-k, top-p and min-p filters, then a draw from an
// xorshift64* generator seeded by the user. Also the log-probabilities of the top tokens.
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

  private:
    uint64_t next_random();  // xorshift64*
    SamplerParams params_;
    uint64_t state_;
};

int32_t argmax(const std::vector<float> &logits);

// The k most likely tokens with their log-softmax values (over the full vocabulary, at
// temperature 1), most likely first; ties go to the lower id.
std::vector<std::pair<int32_t, float>> top_logprobs(const std::vector<float> &logits, int k);

}  // namespace ds4::runtime

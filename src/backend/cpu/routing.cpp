#include "backend/cpu/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/vector_ops.h"

namespace ds4::backend::cpu {

void route_experts(const float *logits, const RouteParams &p, const int32_t *hash_ids,
                   uint32_t *experts, float *weights) {
    std::vector<float> prob(p.n_expert);
    router_probs(logits, 0, p.n_expert, prob.data());
    route_from_probs(prob.data(), p, hash_ids, experts, weights);
}

void router_probs(const float *logits, uint32_t e0, uint32_t e1, float *prob) {
    for (uint32_t e = e0; e < e1; ++e) prob[e] = std::sqrt(softplus(logits[e]));
}

void route_from_probs(const float *prob, const RouteParams &p, const int32_t *hash_ids,
                      uint32_t *experts, float *weights) {
    if (hash_ids) {
        for (uint32_t i = 0; i < p.n_used; ++i) experts[i] = static_cast<uint32_t>(hash_ids[i]);
    } else {
        std::vector<float> biased(prob, prob + p.n_expert);
        if (p.bias)
            for (uint32_t e = 0; e < p.n_expert; ++e) biased[e] += p.bias[e];
        std::vector<uint32_t> idx(p.n_expert);
        std::iota(idx.begin(), idx.end(), 0u);
        std::partial_sort(idx.begin(), idx.begin() + p.n_used, idx.end(),
                          [&](uint32_t a, uint32_t b) {
                              return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
                          });
        std::copy(idx.begin(), idx.begin() + p.n_used, experts);
    }
    float sum = 0.0f;
    for (uint32_t i = 0; i < p.n_used; ++i) sum += prob[experts[i]];
    const float denom = p.normalize ? std::max(sum, 6.103515625e-5f) : 1.0f;
    for (uint32_t i = 0; i < p.n_used; ++i) weights[i] = prob[experts[i]] / denom * p.scale;
}

}  // namespace ds4::backend::cpu

#pragma once
// The router's arithmetic (docs/MODEL.md 4.6), the CPU reference for its GPU twin:
//   prob_e = sqrt(softplus(logit_e));
//   selection: the hash table's ids on hash layers, else the top k of prob_e + bias_e
//     (descending, ties to the lower expert; the bias only selects);
//   weights: the selected prob_e in selection order, divided by max(their sum, 2^-14) when
//     normalising, times the routed scale.
#include <cstdint>

namespace ds4::backend::cpu {

struct RouteParams {
    uint32_t n_expert = 0, n_used = 0;
    const float *bias = nullptr;  // n_expert selection biases, or none
    bool normalize = true;
    float scale = 1.0f;
};

// hash_ids: the n_used experts of this token on a hash layer (already validated), or null.
// experts / weights receive n_used values each.
void route_experts(const float *logits, const RouteParams &p, const int32_t *hash_ids,
                   uint32_t *experts, float *weights);

// The two halves of route_experts, for a caller that spreads the first over threads (a decode
// step's 256 experts: an exp, a log1p and a sqrt each, ~0.1 us): prob[e] = sqrt(softplus(
// logit_e)) for e in [e0, e1), then the selection and weights from all n_expert probs.
void router_probs(const float *logits, uint32_t e0, uint32_t e1, float *prob);
void route_from_probs(const float *prob, const RouteParams &p, const int32_t *hash_ids,
                      uint32_t *experts, float *weights);

}  // namespace ds4::backend::cpu

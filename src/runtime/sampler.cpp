#include "runtime/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace ds4::runtime {

int32_t argmax(const std::vector<float> &logits) {
    if (logits.empty()) throw Error("argmax of empty logits");
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplerParams &p) : params_(p) {
    if (p.temperature < 0) throw Error("temperature must be >= 0");
    if (p.top_p <= 0 || p.top_p > 1) throw Error("top-p must be in (0, 1]");
    if (p.min_p < 0 || p.min_p > 1) throw Error("min-p must be in [0, 1]");
    if (p.top_k < 0) throw Error("top-k must be >= 0");
    state_ =
        p.seed
            ? p.seed
            : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) |
                  1;
}

uint64_t Sampler::next_random() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
}

int32_t Sampler::sample(const std::vector<float> &logits) {
    if (params_.temperature == 0.0f) return argmax(logits);
    // Candidates sorted by logit (ties to the lower id), then filtered.
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    const size_t keep =
        params_.top_k > 0 ? std::min<size_t>(params_.top_k, ids.size()) : ids.size();
    std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    ids.resize(keep);
    std::vector<double> p(ids.size());
    const double mx = logits[ids[0]];
    double sum = 0;
    for (size_t i = 0; i < ids.size(); ++i)
        sum += (p[i] = std::exp((logits[ids[i]] - mx) / params_.temperature));
    for (auto &v : p) v /= sum;
    size_t n = ids.size();
    if (params_.min_p > 0) {  // drop tokens below min_p x the top probability
        size_t m = 1;
        while (m < n && p[m] >= params_.min_p * p[0]) ++m;
        n = m;
    }
    if (params_.top_p < 1) {  // smallest prefix whose mass reaches top_p
        double acc = 0;
        size_t m = 0;
        while (m < n) {
            acc += p[m++];
            if (acc >= params_.top_p) break;
        }
        n = m;
    }
    double mass = 0;
    for (size_t i = 0; i < n; ++i) mass += p[i];
    const double u = double(next_random() >> 11) * 0x1.0p-53 * mass;
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
        acc += p[i];
        if (u < acc) return ids[i];
    }
    return ids[n - 1];
}

std::vector<std::pair<int32_t, float>> top_logprobs(const std::vector<float> &logits, int k) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float l : logits) sum += std::exp(double(l) - mx);
    const double lse = mx + std::log(sum);
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    const size_t n = std::min<size_t>(std::max(k, 0), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    std::vector<std::pair<int32_t, float>> out;
    for (size_t i = 0; i < n; ++i)
        out.push_back({ids[i], static_cast<float>(logits[ids[i]] - lse)});
    return out;
}

}  // namespace ds4::runtime

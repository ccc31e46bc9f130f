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
    auto better = [&](int32_t a, int32_t b) {  // higher logit first, ties to the lower id
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    if (logits.empty()) throw Error("sampling from empty logits");
    // Weights relative to the top token, exp((l - max) / T); min-p keeps those >= min_p. The
    // survivors are found in one pass, so only they are sorted (with min_p 0.05 and T = 1,
    // logits more than 3 below the top are gone).
    const float mx = *std::max_element(logits.begin(), logits.end());
    survivors_.clear();
    auto consider = [&](int32_t id) {
        const double w = std::exp((double(logits[id]) - mx) / params_.temperature);
        if (w > 0.0 && w >= params_.min_p) survivors_.push_back({id, w});
    };
    if (params_.top_k > 0) {  // pre-selects the k best logits (capped at kMaxTopK, as ds4 does)
        ids_.resize(logits.size());
        std::iota(ids_.begin(), ids_.end(), 0);
        const size_t k = std::min<size_t>({size_t(params_.top_k), kMaxTopK, ids_.size()});
        std::nth_element(ids_.begin(), ids_.begin() + (k - 1), ids_.end(), better);
        for (size_t i = 0; i < k; ++i) consider(ids_[i]);
    } else {
        for (size_t i = 0; i < logits.size(); ++i) consider(static_cast<int32_t>(i));
    }
    if (survivors_.empty()) return argmax(logits);  // no finite weight: NaN or infinite logits
    std::sort(survivors_.begin(), survivors_.end(),
              [&](const Candidate &a, const Candidate &b) { return better(a.id, b.id); });
    double total = 0;
    for (const Candidate &c : survivors_) total += c.weight;
    size_t n = survivors_.size();
    if (params_.top_p < 1) {  // smallest prefix of the survivors whose mass reaches top_p
        double acc = 0;
        size_t m = 0;
        while (m < n) {
            acc += survivors_[m++].weight;
            if (acc >= params_.top_p * total) break;
        }
        n = m;
    }
    double mass = 0;
    for (size_t i = 0; i < n; ++i) mass += survivors_[i].weight;
    const double u = double(next_random() >> 11) * 0x1.0p-53 * mass;
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
        acc += survivors_[i].weight;
        if (u < acc) return survivors_[i].id;
    }
    return survivors_[n - 1].id;
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

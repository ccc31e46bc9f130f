#include "backend/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ds4::backend::cpu {

RopeFreqs RopeFreqs::plain(uint32_t n_rot, double base) {
    RopeFreqs r;
    for (uint32_t k = 0; k < n_rot / 2; ++k) r.f.push_back(std::pow(base, -2.0 * k / n_rot));
    return r;
}

RopeFreqs RopeFreqs::yarn(uint32_t n_rot, double base, double factor, double orig_ctx,
                          double beta_fast, double beta_slow) {
    RopeFreqs r = plain(n_rot, base);
    // Dimension index at which a frequency makes `beta` rotations over the original context.
    auto corr = [&](double beta) {
        return n_rot * std::log(orig_ctx / (2.0 * std::numbers::pi * beta)) /
               (2.0 * std::log(base));
    };
    const double lo = std::max(0.0, std::floor(corr(beta_fast)));
    const double hi = std::min(double(n_rot - 1), std::ceil(corr(beta_slow)));
    for (uint32_t k = 0; k < n_rot / 2; ++k) {
        const double ramp = 1.0 - std::clamp((k - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
        r.f[k] = r.f[k] / factor * (1.0 - ramp) + r.f[k] * ramp;
    }
    return r;
}

void rope_tail(float *head, uint32_t head_dim, const RopeFreqs &freqs, int64_t p, bool inverse) {
    rope_tail(head, head_dim, RopeAngles(freqs, p), inverse);
}

RopeAngles::RopeAngles(const RopeFreqs &freqs, int64_t p) {
    cos.resize(freqs.f.size());
    sin.resize(freqs.f.size());
    for (size_t k = 0; k < freqs.f.size(); ++k) {
        const double theta = double(p) * freqs.f[k];
        cos[k] = static_cast<float>(std::cos(theta));
        sin[k] = static_cast<float>(std::sin(theta));
    }
}

void rope_tail(float *head, uint32_t head_dim, const RopeAngles &angles, bool inverse) {
    float *x = head + head_dim - 2 * angles.cos.size();
    for (size_t k = 0; k < angles.cos.size(); ++k) {
        // float(-sin) is -float(sin): rounding is symmetric.
        const float c = angles.cos[k], s = inverse ? -angles.sin[k] : angles.sin[k];
        const float x0 = x[2 * k], x1 = x[2 * k + 1];
        x[2 * k] = x0 * c - x1 * s;
        x[2 * k + 1] = x0 * s + x1 * c;
    }
}

}  // namespace ds4::backend::cpu

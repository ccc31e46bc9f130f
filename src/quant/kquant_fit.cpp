#include "quant/kquant_fit.h"

#include <cmath>
#include <cstring>

namespace ds4::quant::ref {

int nearest_int(float v) {
    // Adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits (the FPU rounds
    // the sum to nearest even); valid while |v| < 2^22.
    const float shifted = v + 12582912.0f;
    int32_t bits;
    std::memcpy(&bits, &shifted, sizeof(bits));
    return (bits & 0x007fffff) - 0x00400000;
}

namespace {

int clamp_level(int l, int nmax) {
    return l < 0 ? 0 : (l > nmax ? nmax : l);
}

float weighted_error(float diff, float w, bool use_mad) {
    return w * (use_mad ? std::fabs(diff) : diff * diff);
}

}  // namespace

float fit_scale_and_min(int n, const float *x, const float *weights, const KQuantFitParams &params,
                        uint8_t *L, float *neg_min, uint8_t *scratch) {
    const int nmax = params.nmax;
    float min = x[0];
    float max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *neg_min = -min;
        return 0.0f;
    }

    // the plain min/max fit
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = static_cast<uint8_t>(clamp_level(nearest_int(iscale * (x[i] - min)), nmax));
        const float diff = scale * L[i] + min - x[i];
        best_error += weighted_error(diff, weights[i], params.use_mad);
    }
    if (params.nsteps < 1) {
        *neg_min = -min;
        return scale;
    }

    for (int step = 0; step <= params.nsteps; ++step) {
        iscale = (params.rmin + params.rdelta * step + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_level(nearest_int(iscale * (x[i] - min)), nmax);
            scratch[i] = static_cast<uint8_t>(l);
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        // weighted least squares of x ~= s*l + m over (s, m): the 2x2 normal equations
        const float det = sum_w * sum_l2 - sum_l * sum_l;
        if (det > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if (this_min > 0) {  // an offset above zero is not representable: refit s alone
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float error = 0;
            for (int i = 0; i < n; ++i) {
                const float diff = this_scale * scratch[i] + this_min - x[i];
                error += weighted_error(diff, weights[i], params.use_mad);
            }
            if (error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = scratch[i];
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

}  // namespace ds4::quant::ref

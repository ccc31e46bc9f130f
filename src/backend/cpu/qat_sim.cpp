#include "backend/cpu/qat_sim.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace ds4::backend::cpu {

float round_e4m3(float a) {
    if (a >= 448.0f) return 448.0f;
    // Subnormals (a < 2^-6) step by 2^-9; a normal binade [2^e, 2^(e+1)) by 2^(e-3). nearbyint
    // rounds half to even in the default mode, which is ties to the even code.
    int e;
    std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the binade is 2^(e-1)
    const int exp2 = std::max(e - 1, -6);
    const float step = std::ldexp(1.0f, exp2 - 3);
    return std::min(448.0f, std::nearbyint(a / step) * step);
}

float round_e2m1(float a) {
    static const float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    int best = 0;
    float best_d = std::fabs(a);
    for (int i = 1; i < 8; ++i) {
        const float d = std::fabs(a - kValues[i]);
        // Strictly closer wins; an exact tie goes to the even index.
        if (d < best_d || (d == best_d && i % 2 == 0 && best % 2 == 1)) {
            best = i;
            best_d = d;
        }
    }
    return kValues[best];
}

namespace {

// 2^ceil(log2(r)) computed exactly from the binary exponent.
float pow2_ceil(float r) {
    int e;
    const float m = std::frexp(r, &e);  // r = m * 2^e, m in [0.5, 1)
    return std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
}

template <typename Round>
void block_sim(float *x, int64_t n, int64_t block, float qmax, float amax_floor, Round round) {
    for (int64_t b = 0; b < n; b += block) {
        const int64_t end = std::min(n, b + block);
        float amax = 0.0f;
        for (int64_t i = b; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float s = pow2_ceil(std::max(amax, amax_floor) / qmax);
        for (int64_t i = b; i < end; ++i) {
            const float v = std::clamp(x[i] / s, -qmax, qmax);
            x[i] = std::copysign(round(std::fabs(v)), v) * s;
        }
    }
}

}  // namespace

void fp8_e4m3_sim(float *x, int64_t n, int64_t block) {
    block_sim(x, n, block, 448.0f, 1e-4f, round_e4m3);
}

void fp4_e2m1_sim(float *x, int64_t n) {
    block_sim(x, n, 32, 6.0f, 7.052966104933725e-38f, round_e2m1);
}

void hadamard(float *x, int64_t n) {
    if (n <= 0 || (n & (n - 1)) != 0)
        throw Error("hadamard: length " + std::to_string(n) + " is not a power of two");
    for (int64_t stride = 1; stride < n; stride *= 2)
        for (int64_t i = 0; i < n; i += 2 * stride)
            for (int64_t j = i; j < i + stride; ++j) {
                const float a = x[j], b = x[j + stride];
                x[j] = a + b;
                x[j + stride] = a - b;
            }
    const float scale = static_cast<float>(1.0 / std::sqrt(double(n)));
    for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

void indexer_qat(float *x, int64_t n) {
    hadamard(x, n);
    fp4_e2m1_sim(x, n);
}

}  // namespace ds4::backend::cpu

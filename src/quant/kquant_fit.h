#pragma once
// The scale/min search shared by the Q2_K and Q4_K quantizers (ggml's make_qkx2_quants and
// nearest_int, same arithmetic in the same order, so our files match ggml's bit for bit).
#include <cstdint>

namespace ds4::quant::ref {

// Round to nearest, ties to even, for |v| < 2^22 (ggml's nearest_int).
int nearest_int(float v);

struct KQuantFitParams {
    int nmax;      // levels are 0 .. nmax
    float rmin;    // first candidate inverse scale is (nmax + rmin) / (max - min)
    float rdelta;  // then + rdelta per step
    int nsteps;    // candidates tried after the first: nsteps + 1
    bool use_mad;  // minimize sum w*|err| instead of sum w*err^2
};

// Fits x[i] ~= scale * L[i] - neg_min over n values, with L[i] in [0, nmax], scale >= 0 and
// neg_min >= 0 (the offset never goes above zero). Starts from the min/max fit; for each
// candidate inverse scale it rounds the levels, solves the weighted least-squares (scale, min)
// for those levels, and keeps the candidate with the smallest weighted error.
// Returns scale; writes the levels to L and the offset to *neg_min. `scratch` holds n levels.
float fit_scale_and_min(int n, const float *x, const float *weights, const KQuantFitParams &params,
                        uint8_t *L, float *neg_min, uint8_t *scratch);

}  // namespace ds4::quant::ref

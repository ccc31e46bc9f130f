#pragma once
// Rotary embedding of the last n_rot dims of a head, adjacent pairs (x[2k], x[2k+1]) rotated by
// theta_k = p * f_k (docs/MODEL.md 4.0). Two frequency sets: plain (ratio-0 layers) and
// YaRN-blended (compressed layers, their compressor and indexer), with no magnitude correction.
#include <cstdint>
#include <vector>

namespace ds4::backend::cpu {

struct RopeFreqs {
    std::vector<double> f;  // n_rot/2 frequencies

    static RopeFreqs plain(uint32_t n_rot, double base);
    // f_k = f0_k / factor * (1 - ramp_k) + f0_k * ramp_k with ramp from the YaRN correction range
    // of beta_fast / beta_slow at the original context length.
    static RopeFreqs yarn(uint32_t n_rot, double base, double factor, double orig_ctx,
                          double beta_fast, double beta_slow);
};

// Rotates the tail x[head_dim - n_rot .. head_dim) of one head at position p; `inverse` rotates
// by -theta (the attention output's inverse RoPE).
void rope_tail(float *head, uint32_t head_dim, const RopeFreqs &freqs, int64_t p, bool inverse);

// The rotation of one position, for the many heads of a token: cos and sin of every theta_k,
// computed and rounded to f32 once (a token's 64 query heads took 64 x n_rot/2 sincos in double).
struct RopeAngles {
    std::vector<float> cos, sin;
    RopeAngles(const RopeFreqs &freqs, int64_t p);
};

// rope_tail with the angles of its position (the form above builds them for its one head).
void rope_tail(float *head, uint32_t head_dim, const RopeAngles &angles, bool inverse);

}  // namespace ds4::backend::cpu

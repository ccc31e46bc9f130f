#pragma once
// The engine against transformers' DeepseekV4ForCausalLM (f32) on the tiny models of
// tests/model/tiny_models.py. The expected logits are the committed fixtures
// (tests/model/fixtures/<model>/index.json and its *.f32 files, written by
// make_tiny_models.py --oracle); the model is the converter's f32 GGUF of the same checkpoint.
// QAT simulation is off: transformers has none (docs/TRANSFORMERS_NOTES.md D1-D2).
//
// What is checked, for every prompt of the fixture:
//   - logits at every position (or, for the real vocabulary, at the positions with full rows),
//     token by token: max |ours - theirs| / max |theirs| <= kTransformersParityBound;
//   - the greedy continuation equal token for token;
//   - chunked prefill of the prompt ends on the same logits as token-by-token evaluation, bit for
//     bit.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device_weights.h"

namespace ds4::tools {

inline constexpr double kTransformersParityBound = 1e-4;

// qat_sim on, or a quantized GGUF of the same checkpoint, measure the deviation instead:
// greedy mismatches are then counted in top1_same, not reported as problems.
struct ParityOptions {
    bool qat_sim = false;
    bool exact = true;  // greedy continuation must match (the f32, no-QAT comparison)
    // Prompts whose fixture stores a subset of positions and no greedy continuation (the long
    // ones) are evaluated in batches of `chunk` up to each stored position instead of token by
    // token, when chunk > 1, and without the chunked-prefill check (their prefill / decode
    // equality is tests/model/test_long_context.cpp's). Every other prompt: token by token.
    uint32_t chunk = 1;
    runtime::Backend backend = runtime::Backend::Cpu;  // where the GGUF runs
};

struct ParityResult {
    double max_abs_diff = 0, max_abs_ref = 0;
    size_t rows_compared = 0, greedy_steps = 0;
    size_t top1_same = 0;       // compared rows whose argmax equals the reference argmax
    size_t worst_position = 0;  // position of max_abs_diff
    // Per compared row, in position order: (position, max |ours - theirs| in that row), and the
    // argmax of ours and of the reference.
    std::vector<std::pair<size_t, double>> row_diffs;
    std::vector<int32_t> top1, top1_ref;
    // Per compared row: the reference's top-1 logit less its second (how clear its choice is).
    std::vector<float> ref_margin;
    std::vector<std::string> problems;  // empty when everything but the bound held

    double ratio() const { return max_abs_ref > 0 ? max_abs_diff / max_abs_ref : 0; }
    double top1_rate() const { return rows_compared ? double(top1_same) / rows_compared : 1.0; }
    bool ok() const { return problems.empty() && ratio() <= kTransformersParityBound; }
};

// fixture_dir: tests/model/fixtures/<model>; gguf: that model's f32 GGUF. Throws ds4::Error when a
// file is missing or malformed.
// SHA-256 of a file's bytes, 64 lowercase hex digits (a fixture names the files it was made
// from by it). Throws ds4::Error when the file cannot be read.
std::string file_sha256(const std::string &path);

ParityResult check_transformers_fixture(const std::string &fixture_dir, const std::string &gguf,
                                        int n_threads, const ParityOptions &opts = {});

}  // namespace ds4::tools

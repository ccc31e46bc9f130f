#pragma once
// The prompt lengths at which a DeepSeek V4 model's attention state changes shape, read from its
// hyper-parameters: the raw sliding window fills, each compression ratio completes its 1st, 2nd
// and 3rd row, the indexer starts choosing (more compressed rows than its top-k), and prefill
// chunks end. The self-consistency modes test one below, at, and one above each.
#include <cstdint>
#include <string>
#include <vector>

#include "model/hparams.h"

namespace ds4::tools {

struct Boundaries {
    std::string description;       // "window 8, ratio 4 x1..3 (4,8,12), ..." for the report
    std::vector<size_t> lengths;   // sorted, distinct, >= 1
    std::vector<uint32_t> chunks;  // prefill chunk sizes worth testing, the last >= every length
    size_t max_length() const { return lengths.empty() ? 0 : lengths.back(); }
};

Boundaries model_boundaries(const model::HParams &hp);

// Deterministic token ids spread over the vocabulary (no tokenizer needed).
std::vector<int32_t> spread_tokens(size_t n, uint32_t n_vocab, uint32_t salt = 0);

}  // namespace ds4::tools

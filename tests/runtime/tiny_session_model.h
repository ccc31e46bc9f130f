#pragma once
// Tiny synthetic models (q8_0 unless asked) with a made-up 512-token vocabulary (~1 MB) for the
// session and generation tests, written once per process and seed under the test temp folder, and
// prompts of made-up token ids.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/synthetic_model.h"

namespace ds4::test {

// Writes a synthetic model of shape `hp` (n_vocab 512) with the made-up 512-token vocabulary.
inline void write_made_up_model(const model::HParams &hp, model::QuantMix mix, uint64_t seed,
                                const std::string &path) {
    gguf::Writer w;
    std::vector<std::string> tokens;
    for (int i = 0; i < 512; ++i) tokens.push_back("tok" + std::to_string(i * 7));
    w.set("tokenizer.ggml.tokens", gguf::Value::array_of_strings(tokens));
    const auto bytes = w.to_bytes();
    auto vocab = gguf::File::from_memory(bytes.data(), bytes.size());
    model::write_synthetic_model(hp, mix, seed, *vocab, path, false);
}

// The tiny synthetic model of `mix` and `seed` (written once per process).
inline const std::string &tiny_model(model::QuantMix mix, uint64_t seed) {
    static std::map<std::pair<model::QuantMix, uint64_t>, std::string> paths;
    auto &path = paths[{mix, seed}];
    if (path.empty()) {
        const std::string p = ::testing::TempDir() + "/session-tiny-" + model::quant_mix_name(mix) +
                              "-" + std::to_string(seed) + ".gguf";
        write_made_up_model(model::shape_preset("tiny", 512), mix, seed, p);
        path = p;
    }
    return path;
}

inline const std::string &tiny_session_model(uint64_t seed) {
    return tiny_model(model::QuantMix::Q8_0, seed);
}

// n made-up token ids of the 512-token vocabulary: (i * mul + add) % 512.
inline std::vector<int32_t> made_up_prompt(size_t n, uint32_t mul = 37, uint32_t add = 5) {
    std::vector<int32_t> t;
    for (size_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * mul + add) % 512));
    return t;
}

}  // namespace ds4::test

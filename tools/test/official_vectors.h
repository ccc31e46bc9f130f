#pragma once
// The official DeepSeek V4 Flash logprob vectors (docs/SURFACES.md 4.2,
// tests/test-vectors/README.md): official.vec, the prompts it names, and the usage.prompt_tokens of
// the raw API answers in official/<id>.official.json beside it.
#include <cstdint>
#include <string>
#include <vector>

namespace ds4::test {

struct VectorTop {
    std::string bytes;  // token bytes
    double logprob = 0;
};

struct VectorStep {
    int index = 0;
    std::string selected;  // token bytes of the official greedy token
    std::vector<VectorTop> tops;
};

struct VectorCase {
    std::string id;
    uint32_t ctx = 0;
    std::string prompt_path;  // resolved, readable
    std::vector<VectorStep> steps;
    // From official/<id>.official.json: the API's prompt token count and greedy token bytes.
    int64_t official_prompt_tokens = -1;
    std::vector<std::string> official_json_tokens;
};

// Reads and validates official.vec (limits of docs/SURFACES.md 4.2: <= 16 steps, <= 32 tops, <= 128
// bytes a token) and the JSON answers beside it. Throws ds4::Error naming the file and line.
std::vector<VectorCase> read_official_vectors(const std::string &vec_path);

// The case the reference engine skips, and why (docs/SURFACES.md 4.3).
inline constexpr const char *kKnownMismatchCase = "long_memory_archive";
inline constexpr const char *kKnownMismatchReason =
    "skipped as by the reference engine: the public API and the official reference graph "
    "disagree after the Hadamard+FP4 indexer change (docs/SURFACES.md 4.3); --known-mismatch-cases "
    "runs it";

}  // namespace ds4::test

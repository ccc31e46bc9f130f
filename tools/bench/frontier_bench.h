#pragma once
// One pass of the frontier method (docs/SURFACES.md 5.1) over a fresh session: at each frontier,
// prefill only the tokens since the previous frontier (timed), snapshot (untimed), greedily decode
// exactly gen_tokens tokens with EOS excluded (timed token by token), restore the snapshot
// (untimed).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "experts/expert_source.h"
#include "runtime/session.h"

namespace ds4::bench {

struct FrontierSample {
    uint32_t ctx_tokens = 0, prefill_tokens = 0, gen_tokens = 0;
    double prefill_s = 0, gen_s = 0;
    double ttft_ms = 0;             // this frontier's prefill + choosing the first token
    double first_decode_ms = 0;     // the first decode step (choose + evaluate one token)
    double p50_ms = 0, p95_ms = 0;  // over the decode steps
    size_t kvcache_bytes = 0;       // kv_payload.h
    size_t max_rss_bytes = 0;       // process peak so far
    std::string tokens_sha256;      // of the generated ids
    // SSD streaming (the model streams its experts): the cache's accounting over this frontier's
    // prefill and decode, and over its decode alone.
    bool ssd = false;
    experts::ExpertStats ssd_all, ssd_gen;
    // The same for the CUDA backend's device tier (its host tier is the cache above).
    bool tier = false;
    runtime::DeviceTierStats tier_all, tier_gen;
    double prefill_tps() const { return prefill_s > 0 ? prefill_tokens / prefill_s : 0; }
    double gen_tps() const { return gen_s > 0 ? gen_tokens / gen_s : 0; }
};

struct PassParams {
    runtime::SessionOptions session;  // ctx = --ctx-alloc
    uint32_t gen_tokens = 128;
    int32_t eos = -1;  // never generated
};

// `prompt` must hold at least frontiers.back() tokens; on_row sees each sample as it is measured.
std::vector<FrontierSample> run_frontier_pass(
    runtime::Model &model, const PassParams &params, std::span<const int32_t> prompt,
    const std::vector<uint32_t> &frontiers,
    const std::function<void(const FrontierSample &)> &on_row = {});

}  // namespace ds4::bench

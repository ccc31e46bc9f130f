#include "frontier_bench.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>

#include "common/error.h"
#include "kv_payload.h"
#include "stats.h"
#include "token_hash.h"

namespace ds4::bench {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

// The first maximal logit other than `excluded`: greedy decoding that never ends the probe early.
int32_t greedy_except(const std::vector<float> &logits, int32_t excluded) {
    int32_t best = -1;
    for (size_t i = 0; i < logits.size(); ++i) {
        if (int32_t(i) == excluded) continue;
        if (best < 0 || logits[i] > logits[best]) best = int32_t(i);
    }
    return best;
}

// The device tier's accounting between two readings (slots and slot size as of the later).
runtime::DeviceTierStats tier_since(const runtime::DeviceTierStats &a,
                                    const runtime::DeviceTierStats &b) {
    runtime::DeviceTierStats d = b;
    d.passes = b.passes - a.passes;
    d.acquires = b.acquires - a.acquires;
    d.hits = b.hits - a.hits;
    d.misses = b.misses - a.misses;
    d.bytes_uploaded = b.bytes_uploaded - a.bytes_uploaded;
    d.upload_wait_ns = b.upload_wait_ns - a.upload_wait_ns;
    return d;
}

// The device tier's statistics now (zeros without one).
runtime::DeviceTierStats tier_now(runtime::Model &model) {
    const runtime::DeviceWeights *d = model.device();
    return d ? d->tier_stats().value_or(runtime::DeviceTierStats{}) : runtime::DeviceTierStats{};
}

// The accounting between two readings of a source's statistics.
experts::ExpertStats stats_since(const experts::ExpertStats &a, const experts::ExpertStats &b) {
    experts::ExpertStats d = b;
    d.gets = b.gets - a.gets;
    d.hits = b.hits - a.hits;
    d.misses = b.misses - a.misses;
    d.bytes_read = b.bytes_read - a.bytes_read;
    d.disk_bytes = b.disk_bytes - a.disk_bytes;
    d.preloaded = b.preloaded - a.preloaded;
    d.prefetch_unused = b.prefetch_unused - a.prefetch_unused;
    d.io_wait_ns = b.io_wait_ns - a.io_wait_ns;
    d.io_busy_ns = b.io_busy_ns - a.io_busy_ns;
    return d;
}

size_t max_rss_bytes() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return size_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace

std::vector<FrontierSample> run_frontier_pass(
    runtime::Model &model, const PassParams &params, std::span<const int32_t> prompt,
    const std::vector<uint32_t> &frontiers,
    const std::function<void(const FrontierSample &)> &on_row) {
    if (frontiers.empty() || prompt.size() < frontiers.back())
        throw Error("the prompt is shorter than the last frontier");
    runtime::Session s(model, params.session);
    std::vector<FrontierSample> out;
    uint32_t prev = 0;
    for (uint32_t frontier : frontiers) {
        FrontierSample r;
        r.ctx_tokens = frontier;
        r.prefill_tokens = frontier - prev;
        r.gen_tokens = params.gen_tokens;
        runtime::ExpertStreaming *ssd = model.streaming();
        const experts::ExpertStats ssd0 = ssd ? ssd->source().stats() : experts::ExpertStats{};
        const runtime::DeviceTierStats tier0 = tier_now(model);
        const auto t0 = Clock::now();
        s.eval(prompt.subspan(prev, frontier - prev));
        const auto t1 = Clock::now();
        const experts::ExpertStats ssd1 = ssd ? ssd->source().stats() : experts::ExpertStats{};
        const runtime::DeviceTierStats tier1 = tier_now(model);
        r.prefill_s = ms_between(t0, t1) / 1000;
        prev = frontier;

        const runtime::Session::Snapshot snap = s.save();
        r.kvcache_bytes = snapshot_payload_bytes(snap);
        std::vector<int32_t> generated;
        std::vector<double> step_ms;
        for (uint32_t k = 0; k < params.gen_tokens; ++k) {
            const auto a = Clock::now();
            const int32_t id = greedy_except(s.logits(), params.eos);
            const auto b = Clock::now();
            s.eval(std::span(&id, 1));
            const auto c = Clock::now();
            if (k == 0) {
                r.ttft_ms = ms_between(t0, t1) + ms_between(a, b);
                r.first_decode_ms = ms_between(a, c);
            }
            step_ms.push_back(ms_between(a, c));
            generated.push_back(id);
        }
        double total_ms = 0;
        for (double m : step_ms) total_ms += m;
        r.gen_s = total_ms / 1000;
        r.p50_ms = percentile(step_ms, 50);
        r.p95_ms = percentile(step_ms, 95);
        r.tokens_sha256 = tools::tokens_sha256(generated);
        if (ssd) {
            const experts::ExpertStats ssd2 = ssd->source().stats();
            r.ssd = true;
            r.ssd_all = stats_since(ssd0, ssd2);
            r.ssd_gen = stats_since(ssd1, ssd2);
        }
        if (model.device() && model.device()->tier_stats()) {
            const runtime::DeviceTierStats tier2 = tier_now(model);
            r.tier = true;
            r.tier_all = tier_since(tier0, tier2);
            r.tier_gen = tier_since(tier1, tier2);
        }
        s.restore(snap);
        r.max_rss_bytes = max_rss_bytes();
        if (on_row) on_row(r);
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace ds4::bench

#include "bench_rows.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "stats.h"

namespace ds4::bench {

const std::vector<std::string> &bench_columns() {
    static const std::vector<std::string> cols = {"ctx_tokens", "prefill_tokens",  "prefill_tps",
                                                  "gen_tokens", "gen_tps",         "kvcache_bytes",
                                                  "ttft_ms",    "first_decode_ms", "p50_ms",
                                                  "p95_ms",     "max_rss_bytes",   "tokens_sha256"};
    return cols;
}

CsvTable median_rows(const std::vector<std::vector<FrontierSample>> &runs) {
    if (runs.empty()) throw Error("no benchmark runs");
    CsvTable t{.header = bench_columns()};
    for (size_t f = 0; f < runs[0].size(); ++f) {
        const FrontierSample &first = runs[0][f];
        std::vector<double> prefill_tps, gen_tps, ttft, first_decode, p50, p95;
        size_t rss = 0;
        for (size_t r = 0; r < runs.size(); ++r) {
            const FrontierSample &s = runs[r].at(f);
            if (s.tokens_sha256 != first.tokens_sha256 || s.kvcache_bytes != first.kvcache_bytes)
                throw Error(fmt::format(
                    "run {} differs from run 1 at ctx {}: tokens {} vs {}, KV bytes {} vs {} "
                    "(the engine is not deterministic)",
                    r + 1, s.ctx_tokens, s.tokens_sha256, first.tokens_sha256, s.kvcache_bytes,
                    first.kvcache_bytes));
            prefill_tps.push_back(s.prefill_tps());
            gen_tps.push_back(s.gen_tps());
            ttft.push_back(s.ttft_ms);
            first_decode.push_back(s.first_decode_ms);
            p50.push_back(s.p50_ms);
            p95.push_back(s.p95_ms);
            rss = std::max(rss, s.max_rss_bytes);
        }
        t.rows.push_back({
            {"ctx_tokens", fmt::format("{}", first.ctx_tokens)},
            {"prefill_tokens", fmt::format("{}", first.prefill_tokens)},
            {"prefill_tps", fmt::format("{:.2f}", median(prefill_tps))},
            {"gen_tokens", fmt::format("{}", first.gen_tokens)},
            {"gen_tps", fmt::format("{:.2f}", median(gen_tps))},
            {"kvcache_bytes", fmt::format("{}", first.kvcache_bytes)},
            {"ttft_ms", fmt::format("{:.3f}", median(ttft))},
            {"first_decode_ms", fmt::format("{:.3f}", median(first_decode))},
            {"p50_ms", fmt::format("{:.3f}", median(p50))},
            {"p95_ms", fmt::format("{:.3f}", median(p95))},
            {"max_rss_bytes", fmt::format("{}", rss)},
            {"tokens_sha256", first.tokens_sha256},
        });
    }
    return t;
}

}  // namespace ds4::bench

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

const std::vector<std::string> &ssd_columns() {
    static const std::vector<std::string> cols = {
        "ssd_entries",    "ssd_hits",         "ssd_misses",
        "ssd_hit_rate",   "ssd_bytes_read",   "ssd_read_gibps",
        "ssd_io_wait_ms", "ssd_gen_hit_rate", "ssd_gen_bytes_per_token"};
    return cols;
}

const std::vector<std::string> &device_tier_columns() {
    static const std::vector<std::string> cols = {"dev_slots",          "dev_hit_rate",
                                                  "dev_bytes_uploaded", "dev_upload_wait_ms",
                                                  "dev_gen_hit_rate",   "dev_gen_bytes_per_token"};
    return cols;
}

namespace {

double hit_rate(const experts::ExpertStats &s) {
    return s.gets ? double(s.hits) / double(s.gets) : 0.0;
}

double hit_rate(const runtime::DeviceTierStats &s) {
    return s.acquires ? double(s.hits) / double(s.acquires) : 0.0;
}

// The device tier's cells of a row: each the median over the runs.
void add_tier_cells(const std::vector<std::vector<FrontierSample>> &runs, size_t f,
                    CsvRecord &row) {
    std::vector<double> rate, bytes, wait_ms, gen_rate, gen_bpt;
    for (const auto &run : runs) {
        const FrontierSample &s = run.at(f);
        rate.push_back(hit_rate(s.tier_all));
        bytes.push_back(double(s.tier_all.bytes_uploaded));
        wait_ms.push_back(double(s.tier_all.upload_wait_ns) / 1e6);
        gen_rate.push_back(hit_rate(s.tier_gen));
        gen_bpt.push_back(s.gen_tokens ? double(s.tier_gen.bytes_uploaded) / s.gen_tokens : 0.0);
    }
    row["dev_slots"] = fmt::format("{}", runs[0].at(f).tier_all.slots);
    row["dev_hit_rate"] = fmt::format("{:.4f}", median(rate));
    row["dev_bytes_uploaded"] = fmt::format("{:.0f}", median(bytes));
    row["dev_upload_wait_ms"] = fmt::format("{:.3f}", median(wait_ms));
    row["dev_gen_hit_rate"] = fmt::format("{:.4f}", median(gen_rate));
    row["dev_gen_bytes_per_token"] = fmt::format("{:.0f}", median(gen_bpt));
}

// The SSD cells of a row: each the median over the runs.
void add_ssd_cells(const std::vector<std::vector<FrontierSample>> &runs, size_t f, CsvRecord &row) {
    std::vector<double> hits, misses, rate, bytes, gibps, wait_ms, gen_rate, gen_bpt;
    for (const auto &run : runs) {
        const FrontierSample &s = run.at(f);
        const experts::ExpertStats &a = s.ssd_all, &g = s.ssd_gen;
        hits.push_back(double(a.hits));
        misses.push_back(double(a.misses));
        rate.push_back(hit_rate(a));
        bytes.push_back(double(a.bytes_read));
        gibps.push_back(a.io_busy_ns ? double(a.disk_bytes) / (1024.0 * 1024 * 1024) /
                                           (double(a.io_busy_ns) / 1e9)
                                     : 0.0);
        wait_ms.push_back(double(a.io_wait_ns) / 1e6);
        gen_rate.push_back(hit_rate(g));
        gen_bpt.push_back(s.gen_tokens ? double(g.bytes_read) / s.gen_tokens : 0.0);
    }
    row["ssd_entries"] = fmt::format("{}", runs[0].at(f).ssd_all.entries);
    row["ssd_hits"] = fmt::format("{:.0f}", median(hits));
    row["ssd_misses"] = fmt::format("{:.0f}", median(misses));
    row["ssd_hit_rate"] = fmt::format("{:.4f}", median(rate));
    row["ssd_bytes_read"] = fmt::format("{:.0f}", median(bytes));
    row["ssd_read_gibps"] = fmt::format("{:.3f}", median(gibps));
    row["ssd_io_wait_ms"] = fmt::format("{:.3f}", median(wait_ms));
    row["ssd_gen_hit_rate"] = fmt::format("{:.4f}", median(gen_rate));
    row["ssd_gen_bytes_per_token"] = fmt::format("{:.0f}", median(gen_bpt));
}

}  // namespace

CsvTable median_rows(const std::vector<std::vector<FrontierSample>> &runs) {
    if (runs.empty()) throw Error("no benchmark runs");
    CsvTable t{.header = bench_columns()};
    if (!runs[0].empty() && runs[0][0].ssd)
        t.header.insert(t.header.end(), ssd_columns().begin(), ssd_columns().end());
    if (!runs[0].empty() && runs[0][0].tier)
        t.header.insert(t.header.end(), device_tier_columns().begin(), device_tier_columns().end());
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
        if (first.ssd) add_ssd_cells(runs, f, t.rows.back());
        if (first.tier) add_tier_cells(runs, f, t.rows.back());
    }
    return t;
}

}  // namespace ds4::bench

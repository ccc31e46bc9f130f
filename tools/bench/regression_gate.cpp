#include "regression_gate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <set>

namespace ds4::bench {

namespace {

struct Metric {
    const char *name;
    bool higher_is_better;  // throughputs; latencies are lower-is-better
};

constexpr Metric kMetrics[] = {
    {"prefill_tps", true},      {"gen_tps", true}, {"ttft_ms", false},
    {"first_decode_ms", false}, {"p50_ms", false}, {"p95_ms", false},
};

// Columns that must be equal for the two rows to measure the same work.
constexpr const char *kSameWork[] = {"prefill_tokens", "gen_tokens", "tokens_sha256"};

const std::string *cell(const CsvRecord &r, const std::string &col) {
    const auto it = r.find(col);
    return it == r.end() ? nullptr : &it->second;
}

bool parse_number(const std::string &s, double &out) {
    char *end = nullptr;
    out = std::strtod(s.c_str(), &end);
    return !s.empty() && end == s.c_str() + s.size();
}

bool has_column(const CsvTable &t, const std::string &c) {
    return std::find(t.header.begin(), t.header.end(), c) != t.header.end();
}

}  // namespace

GateReport check_regression(const CsvTable &ours, const CsvTable &baseline,
                            double max_regress_pct) {
    GateReport g;
    // Every line is one comparison; `fail` is for the failed ones.
    auto fail = [&](std::string line) {
        ++g.failures;
        ++g.comparisons;
        g.lines.push_back(std::move(line));
    };
    for (const char *c : {"ctx_tokens", "tokens_sha256"})
        if (!has_column(baseline, c))
            fail(fmt::format("MISMATCH the baseline has no {} column", c));
    if (!g.passed()) return g;

    std::set<std::string> matched;
    for (const auto &row : ours.rows) {
        const std::string &ctx = *cell(row, "ctx_tokens");
        const auto base =
            std::find_if(baseline.rows.begin(), baseline.rows.end(),
                         [&](const CsvRecord &b) { return b.at("ctx_tokens") == ctx; });
        if (base == baseline.rows.end()) {
            fail(
                fmt::format("MISMATCH ctx {}: no baseline row for this frontier (other "
                            "--ctx-start/--ctx-max/--step-* settings?)",
                            ctx));
            continue;
        }
        matched.insert(ctx);
        for (const char *col : kSameWork) {
            const std::string *b = cell(*base, col);
            if (!b) continue;  // only tokens_sha256 is required, checked above
            const std::string &o = *cell(row, col);
            if (o != *b) {
                fail(fmt::format("MISMATCH ctx {} {}: {} vs baseline {}", ctx, col, o, *b));
            } else {
                ++g.comparisons;
                g.lines.push_back(fmt::format("ok ctx {} {}: same as the baseline", ctx, col));
            }
        }
        for (const Metric &m : kMetrics) {
            const std::string *b = cell(*base, m.name);
            if (!b) {
                g.lines.push_back(
                    fmt::format("-- ctx {} {}: not in the baseline, not compared", ctx, m.name));
                continue;
            }
            double bv = 0, ov = 0;
            if (!parse_number(*b, bv) || !parse_number(*cell(row, m.name), ov)) {
                fail(fmt::format("MISMATCH ctx {} {}: '{}' vs baseline '{}' is not a number", ctx,
                                 m.name, *cell(row, m.name), *b));
                continue;
            }
            if (bv <= 0 || ov <= 0) {
                g.lines.push_back(
                    fmt::format("-- ctx {} {}: {} vs baseline {}, not compared (a "
                                "zero cannot be a ratio)",
                                ctx, m.name, ov, bv));
                continue;
            }
            // As a time: our time per unit of work over the baseline's.
            const double slower_pct = (m.higher_is_better ? bv / ov : ov / bv) * 100 - 100;
            const std::string what = fmt::format(
                "ctx {} {}: {} vs baseline {}: {:.1f}% {}", ctx, m.name, *cell(row, m.name), *b,
                std::abs(slower_pct), slower_pct >= 0 ? "slower" : "faster");
            if (slower_pct > max_regress_pct) {
                fail(fmt::format("REGRESSION {} (limit {}%)", what, max_regress_pct));
            } else {
                ++g.comparisons;
                g.lines.push_back("ok " + what);
            }
        }
    }
    for (const auto &b : baseline.rows)
        if (!matched.count(b.at("ctx_tokens")))
            fail(fmt::format("MISMATCH ctx {}: in the baseline but not measured here",
                             b.at("ctx_tokens")));
    return g;
}

}  // namespace ds4::bench

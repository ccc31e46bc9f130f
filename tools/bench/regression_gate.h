#pragma once
// The release gate (--baseline FILE.csv --max-regress PCT): each frontier's medians against the
// baseline row of the same ctx_tokens. It fails when a median is more than PCT percent slower
// (time per token, or latency, above (1 + PCT/100) x the baseline's), when the generated tokens
// differ (tokens_sha256), or when the two files do not measure the same thing (frontiers,
// prefill_tokens, gen_tokens).
#include <string>
#include <vector>

#include "bench_rows.h"

namespace ds4::bench {

struct GateReport {
    std::vector<std::string> lines;  // one per comparison, "REGRESSION"/"MISMATCH" on failures
    int comparisons = 0, failures = 0;
    bool passed() const { return failures == 0; }
};

GateReport check_regression(const CsvTable &ours, const CsvTable &baseline, double max_regress_pct);

}  // namespace ds4::bench

#pragma once
// The summary statistics of the bench: medians across runs, percentiles of per-token latencies.
#include <vector>

namespace ds4::bench {

// Median; the mean of the two middle values for an even count; 0 for none.
double median(std::vector<double> v);
// Nearest-rank percentile (p in (0, 100]): the smallest value with at least p% of the values at
// or below it, so p95 of 20 samples is the 19th smallest. 0 for none.
double percentile(std::vector<double> v, double p);

}  // namespace ds4::bench

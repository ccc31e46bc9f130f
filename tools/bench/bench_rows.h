#pragma once
// The rows ds4-bench prints: one per frontier, the medians of the N runs' samples, formatted as
// CSV cells (the reference's six columns first, then ours).
#include <map>
#include <string>
#include <vector>

#include "frontier_bench.h"

namespace ds4::bench {

// Column name -> formatted value.
using CsvRecord = std::map<std::string, std::string>;

struct CsvTable {
    std::vector<std::string> header;
    std::vector<CsvRecord> rows;
};

// ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,ttft_ms,
// first_decode_ms,p50_ms,p95_ms,max_rss_bytes,tokens_sha256
const std::vector<std::string> &bench_columns();
// Appended after those when the model streams its experts (--ssd-streaming), so that the CSV of a
// resident run keeps its columns: ssd_entries,ssd_hits,ssd_misses,ssd_hit_rate,ssd_bytes_read,
// ssd_read_gibps,ssd_io_wait_ms,ssd_gen_hit_rate,ssd_gen_bytes_per_token (docs/BENCH.md).
const std::vector<std::string> &ssd_columns();
// Then, on the CUDA backend, the device tier's: dev_slots,dev_hit_rate,dev_bytes_uploaded,
// dev_upload_wait_ms,dev_gen_hit_rate,dev_gen_bytes_per_token (the ssd_ columns are then the
// host tier's).
const std::vector<std::string> &device_tier_columns();

// runs[r][f]: run r, frontier f. Timings become medians over the runs, max_rss_bytes the maximum.
// Throws ds4::Error when the runs disagree on the generated tokens or the KV size: a benchmark of
// a nondeterministic engine measures nothing comparable.
CsvTable median_rows(const std::vector<std::vector<FrontierSample>> &runs);

}  // namespace ds4::bench

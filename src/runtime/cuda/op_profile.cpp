#include "runtime/cuda/op_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"

namespace ds4::runtime::cuda_backend {

OpProfile::OpProfile() {
    const char *v = std::getenv("DS4_CUDA_PROFILE");
    on_ = v != nullptr && *v != '\0' && std::string(v) != "0";
}

OpProfile::~OpProfile() {
    for (const Pending &p : pending_) {
        cudaEventDestroy(p.start);
        cudaEventDestroy(p.stop);
    }
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t OpProfile::event() {
    if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
    }
    cudaEvent_t e;
    DS4_CUDA_CHECK(cudaEventCreate(&e));
    return e;
}

size_t OpProfile::begin(cudaStream_t s, std::string key, double bytes) {
    Pending p{event(), event(), std::move(key), bytes};
    DS4_CUDA_CHECK(cudaEventRecord(p.start, s));
    pending_.push_back(std::move(p));
    return pending_.size() - 1;
}

void OpProfile::end(cudaStream_t s, size_t call) {
    DS4_CUDA_CHECK(cudaEventRecord(pending_.at(call).stop, s));
}

void OpProfile::collect() {
    for (Pending &p : pending_) {
        float ms = 0;
        DS4_CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
        Total &t = totals_[p.key];
        t.calls += 1;
        t.ms += ms;
        t.bytes += p.bytes;
        free_.push_back(p.start);
        free_.push_back(p.stop);
    }
    pending_.clear();
}

void OpProfile::report() const {
    if (!on_ || totals_.empty() || tokens_ == 0) return;
    std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto &a, const auto &b) { return a.second.ms > b.second.ms; });
    double total_ms = 0, total_bytes = 0;
    for (const auto &r : rows) {
        total_ms += r.second.ms;
        total_bytes += r.second.bytes;
    }
    const double n = double(tokens_);
    std::string out = fmt::format(
        "CUDA profile: {} tokens, {:.3f} ms per token timed, {:.3f} GB of weights per token\n"
        "  {:<40} {:>8} {:>10} {:>6} {:>10} {:>8}\n",
        tokens_, total_ms / n, total_bytes / n / 1e9, "operation", "calls/tok", "ms/tok", "%",
        "MB/tok", "GB/s");
    for (const auto &[key, t] : rows)
        out += fmt::format("  {:<40} {:>8.1f} {:>10.4f} {:>6.1f} {:>10.2f} {:>8.0f}\n", key,
                           double(t.calls) / n, t.ms / n, 100.0 * t.ms / total_ms,
                           t.bytes / n / 1e6, t.ms > 0 ? t.bytes / (t.ms * 1e-3) / 1e9 : 0.0);
    std::fputs(out.c_str(), stderr);
}

}  // namespace ds4::runtime::cuda_backend

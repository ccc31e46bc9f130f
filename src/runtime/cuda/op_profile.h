#pragma once
// DS4_CUDA_PROFILE=1: the time of every operation class of the CUDA backend, measured with a pair
// of events around each operation on the session stream, summed per class and printed when the
// session ends (one line per class: calls, ms per token, share, bytes of weights read per token
// and the bandwidth that makes). Profiling launches every kernel (no graph: events between the
// operations of a captured graph would not time them), so the total is the eager step's time.
// One-token batches (decode) and larger ones (prefill) have a table each, as on the CPU.
// Off, a scope costs one branch.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/op_times.h"

namespace ds4::runtime::cuda_backend {

class OpProfile {
  public:
    OpProfile();  // on when DS4_CUDA_PROFILE is set and not "0"
    ~OpProfile();
    OpProfile(const OpProfile &) = delete;
    OpProfile &operator=(const OpProfile &) = delete;

    bool on() const { return on_; }
    // Brackets the work enqueued on s between begin and end as one call of class `key` that reads
    // `bytes` bytes of weights. Scopes may nest (begin returns what end takes); a nested scope's
    // time is also its parent's, so the table's classes are best kept disjoint.
    size_t begin(cudaStream_t s, std::string key, double bytes);
    void end(cudaStream_t s, size_t call);
    // After the stream is synchronised: adds the pending calls' times to their classes.
    void collect();
    // A batch of n tokens begins: its calls go to the decode table (n = 1) or the prefill one.
    void count_tokens(int64_t n) {
        batch_ = n;
        table(n > 1).count_tokens(n);
    }
    // The table, on stderr (nothing when off or nothing was timed).
    void report() const;

  private:
    struct Pending {
        cudaEvent_t start, stop;
        std::string key;
        double bytes;
        bool prefill;
    };
    OpTimes &table(bool prefill) { return prefill ? prefill_ : decode_; }
    cudaEvent_t event();

    bool on_ = false;
    std::vector<Pending> pending_;
    std::vector<cudaEvent_t> free_;
    int64_t batch_ = 1;
    OpTimes decode_, prefill_;
};

// RAII: one operation of the profile (nothing when the profile is off).
class ProfileScope {
  public:
    ProfileScope(OpProfile &p, cudaStream_t s, const char *key, double bytes = 0,
                 const std::string &detail = {})
        : p_(p.on() ? &p : nullptr), s_(s) {
        if (p_) call_ = p_->begin(s, detail.empty() ? key : std::string(key) + " " + detail, bytes);
    }
    ~ProfileScope() {
        if (p_) p_->end(s_, call_);
    }
    ProfileScope(ProfileScope &&o) noexcept : p_(o.p_), s_(o.s_), call_(o.call_) { o.p_ = nullptr; }
    ProfileScope(const ProfileScope &) = delete;
    ProfileScope &operator=(const ProfileScope &) = delete;
    ProfileScope &operator=(ProfileScope &&) = delete;

  private:
    OpProfile *p_;
    cudaStream_t s_;
    size_t call_ = 0;
};

}  // namespace ds4::runtime::cuda_backend

#pragma once
// DS4_CPU_PROFILE=1: the wall time of every operation class of the CPU backend on the calling
// thread (which works in every parallel loop and waits for it), summed per class and printed when
// the session ends (runtime/op_times.h: calls, ms per token, share, weight bytes and bandwidth).
// The classes are the model order's operations, the products by weight role and format, and
// the phases inside attention (KV rows and compressors, the indexer's selection, gathering the
// visible rows, attending) and the routed experts (routing, the products): what tells the
// serial phases from the parallel ones as threads are added. One-token batches (decode) and
// larger ones (prefill) have a table each. Off, a scope costs one branch.
#include <chrono>
#include <string>

#include "runtime/op_times.h"

namespace ds4::runtime {

class CpuProfile {
  public:
    CpuProfile() : on_(profile_requested("DS4_CPU_PROFILE")) {}
    ~CpuProfile() {
        if (!on_) return;
        decode_.report("CPU profile, decode (one-token batches)");
        prefill_.report("CPU profile, prefill (batches of several tokens)");
    }
    CpuProfile(const CpuProfile &) = delete;
    CpuProfile &operator=(const CpuProfile &) = delete;

    bool on() const { return on_; }
    // The batch now running (CpuOps::begin_batch) picks the table; end_batch counts its tokens.
    void begin_batch(int64_t n) { batch_ = n; }
    void end_batch() { times().count_tokens(batch_); }
    OpTimes &times() { return batch_ > 1 ? prefill_ : decode_; }

  private:
    bool on_;
    int64_t batch_ = 1;
    OpTimes decode_, prefill_;
};

// RAII: one call of class `key` reading `bytes` bytes of weights (nothing when the profile is
// off). Scopes may nest; a nested scope's time is also its parent's.
class CpuScope {
  public:
    CpuScope(CpuProfile &p, const char *key, double bytes = 0) : p_(p.on() ? &p : nullptr) {
        if (p_) start(key, bytes);
    }
    CpuScope(CpuProfile &p, const char *op, model::Tensor w, double m) : p_(p.on() ? &p : nullptr) {
        if (p_) start(std::string(op) + " " + weight_role(w), double(w->n_bytes) * m);
    }
    ~CpuScope() { stop(); }
    // Ends this call and starts one of class `key` (a sequence of phases in one scope).
    void next(const char *key, double bytes = 0) {
        if (!p_) return;
        stop();
        start(key, bytes);
    }
    CpuScope(const CpuScope &) = delete;
    CpuScope &operator=(const CpuScope &) = delete;

  private:
    using Clock = std::chrono::steady_clock;
    void stop() {
        if (p_)
            p_->times().add(key_,
                            std::chrono::duration<double, std::milli>(Clock::now() - t0_).count(),
                            bytes_);
    }
    void start(std::string key, double bytes) {
        key_ = std::move(key);
        bytes_ = bytes;
        t0_ = Clock::now();
    }
    CpuProfile *p_;
    std::string key_;
    double bytes_ = 0;
    Clock::time_point t0_;
};

}  // namespace ds4::runtime

#pragma once
// The table of an operation profile (DS4_CPU_PROFILE, DS4_CUDA_PROFILE): time and weight bytes
// summed per operation class, printed per token when the session ends (one line per class:
// calls, ms per token, share, bytes of weights read per token and the bandwidth that makes).
// The backends measure (host clock, device events) and add here.
#include <cstdint>
#include <map>
#include <string>

#include "model/weights.h"

namespace ds4::runtime {

class OpTimes {
  public:
    void add(const std::string &key, double ms, double bytes);
    void count_tokens(int64_t n) { tokens_ += n; }
    // The table on stderr under `title` (nothing when nothing was timed).
    void report(const char *title) const;

  private:
    struct Total {
        int64_t calls = 0;
        double ms = 0, bytes = 0;
    };
    std::map<std::string, Total> totals_;
    int64_t tokens_ = 0;
};

// A weight's role and format for a profile key: "blk.3.attn_q_a.weight" -> "attn_q_a Q8_0".
std::string weight_role(model::Tensor w);

// Whether the environment variable `name` asks for a profile (set, not empty, not "0").
bool profile_requested(const char *name);

}  // namespace ds4::runtime

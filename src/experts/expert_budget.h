#pragma once
// The size of a cache of routed experts as the user gives it (--ssd-streaming-cache-experts,
// --ssd-streaming-host-cache): a count of slots, a share of the routed experts or a size; all
// three 0 is `auto`, which each cache works out from the memory it may take.
#include <algorithm>
#include <cstdint>

namespace ds4::experts {

struct ExpertBudget {
    uint64_t experts = 0;  // a count of slots, else
    double percent = 0;    // a share of the routed experts, in (0, 100], else
    uint64_t bytes = 0;    // a size, whole slots of it

    bool automatic() const { return experts == 0 && !(percent > 0) && bytes == 0; }

    // The slots asked for by a budget that is not automatic, over n_total routed experts of
    // slot_bytes each: a share rounds down, to at least 1. Neither capped at n_total nor checked
    // against the floor (the cache does both).
    uint64_t slots(uint64_t n_total, uint64_t slot_bytes) const {
        if (experts != 0) return experts;
        if (percent > 0) return std::max<uint64_t>(1, uint64_t(double(n_total) * percent / 100.0));
        return bytes / slot_bytes;
    }
};

}  // namespace ds4::experts

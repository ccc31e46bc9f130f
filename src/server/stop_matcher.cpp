#include "server/stop_matcher.h"

#include <algorithm>

namespace ds4::server {

std::string StopMatcher::push(std::string_view text) {
    if (stopped_) return "";
    held_.append(text);
    // Everything shown so far ended before any possible start of a stop sequence, so the
    // earliest match, if any, lies in held_.
    size_t first = std::string::npos;
    for (const std::string &s : stops_) {
        const size_t at = held_.find(s);
        if (at < first) {
            first = at;
            matched_ = s;
        }
    }
    if (first != std::string::npos) {
        stopped_ = true;
        std::string out = held_.substr(0, first);
        held_.clear();
        return out;
    }
    // The longest tail of held_ that is a proper prefix of a stop sequence.
    size_t keep = 0;
    for (const std::string &s : stops_) {
        for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
            if (std::string_view(held_).substr(held_.size() - n) ==
                std::string_view(s).substr(0, n)) {
                keep = n;
                break;
            }
        }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string StopMatcher::finish() {
    std::string out;
    if (!stopped_) out.swap(held_);
    held_.clear();
    return out;
}

}  // namespace ds4::server

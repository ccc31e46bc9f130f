#include "server/think_tool_gate.h"

#include <algorithm>

#include "tokenizer/tool_call.h"

namespace ds4::server {

ThinkToolGate::Output ThinkToolGate::push(std::string_view text) {
    constexpr std::string_view kOpen = tokenizer::kDsmlToolCallsOpen;
    held_ += text;
    Output out;
    if (const size_t at = held_.find(kOpen); at != std::string::npos) {
        out.reasoning = held_.substr(0, at);
        out.opened = true;
        out.rest = held_.substr(at);
        held_.clear();
        return out;
    }
    // Hold the longest tail that is a proper prefix of the opener.
    size_t hold = 0;
    for (size_t n = std::min(held_.size(), kOpen.size() - 1); n > 0; --n)
        if (std::string_view(held_).substr(held_.size() - n) == kOpen.substr(0, n)) {
            hold = n;
            break;
        }
    out.reasoning = held_.substr(0, held_.size() - hold);
    held_.erase(0, held_.size() - hold);
    return out;
}

std::string ThinkToolGate::flush() {
    std::string out;
    out.swap(held_);
    return out;
}

}  // namespace ds4::server

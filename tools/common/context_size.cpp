#include "context_size.h"

#include <fmt/format.h>

#include <cstdio>
#include <limits>

#include "memory_check.h"

namespace ds4::tools {

uint32_t context_for(uint64_t requested, const model::HParams &hp, runtime::SessionOptions so,
                     const std::string &flag) {
    uint64_t ctx = requested;
    if (hp.context_length && ctx > hp.context_length) {
        ctx = hp.context_length;
        fmt::print(stderr, "ds4: {} {} is above the model's context length; using {}\n", flag,
                   requested, ctx);
    }
    if (constexpr uint64_t kMax = std::numeric_limits<uint32_t>::max(); ctx > kMax) {
        ctx = kMax;
        fmt::print(stderr, "ds4: {} {} is above the {} positions a session holds; using {}\n", flag,
                   requested, kMax, ctx);
    }
    so.ctx = uint32_t(ctx);
    check_memory_fits(runtime::Session::kv_bytes_for(hp, so),
                      fmt::format("the KV cache of a {}-token context", ctx),
                      fmt::format("lower {}", flag));
    return so.ctx;
}

}  // namespace ds4::tools

#include "run_env.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "common/error.h"
#include "exit_codes.h"
#include "quant/quant.h"

namespace ds4::tools {

namespace {

int cores() {
    return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

int resolve_threads(int requested, const std::string &tool) {
    int n = requested;
    if (n == 0) {
        if (const char *env = std::getenv("DS4_THREADS"); env && *env) {
            const std::string_view s(env);
            int v = -1;
            const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
            if (ec != std::errc() || p != s.data() + s.size() || v < 0 || v > kMaxThreads)
                throw UsageError(fmt::format(
                    "DS4_THREADS={} is not a thread count: expected a whole number from 0 to {} "
                    "(0 = all cores)",
                    s.substr(0, 40), kMaxThreads));
            n = v;
        }
    }
    if (n > cores())
        fmt::print(stderr,
                   "{}: warning: {} threads on {} cores; more threads than cores usually runs "
                   "slower\n",
                   tool, n, cores());
    return n;
}

void check_simd_env() {
    try {
        (void)quant::detected_simd_level();
    } catch (const Error &e) {
        throw UsageError(e.what());
    }
}

int effective_threads(int resolved) {
    return resolved > 0 ? resolved : cores();
}

}  // namespace ds4::tools

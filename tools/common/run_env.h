#pragma once
// The run-time settings every engine tool takes from its flags and environment, checked at start
// (before a model loads): the thread count (-t N; 0 = DS4_THREADS when set, else every core)
// and the DS4_SIMD cap. Bad values throw UsageError.
#include <string>

namespace ds4::tools {

// The largest thread count a tool accepts; a pool of more threads than this is a typo.
inline constexpr int kMaxThreads = 1024;

// The thread count to use for `-t requested` (0 = DS4_THREADS when set, else 0 for all cores).
// Throws UsageError for a DS4_THREADS that is not a whole number in [0, kMaxThreads]. Warns on
// stderr ("<tool>: warning: ...") when the count is above the machine's cores.
int resolve_threads(int requested, const std::string &tool);

// Throws UsageError when DS4_SIMD holds something other than a SIMD level name.
void check_simd_env();

// The number of threads a request resolves to (0 = every core), for the start-up line.
int effective_threads(int resolved);

}  // namespace ds4::tools

#pragma once
// The line ds4 and ds4-bench print once the model is loaded, with what a user checks first:
//   ds4: model tiny.gguf "DeepSeek V4 Flash" (12.34 MiB), routed experts q8_0, 6 layers,
//   context length 4096, 2 threads, SIMD avx2, backend cpu
// (one line; on the CUDA backend it ends "backend cuda (<device name>)": the threads and SIMD
// level are still those of the host side). Shared by ds4 and ds4-bench.
#include <string>

#include "runtime/session.h"

namespace ds4::tools {

std::string startup_line(const std::string &tool, const std::string &path, runtime::Model &model);

}  // namespace ds4::tools

#pragma once
// The backend flags of the engine tools (ds4, ds4-bench, ds4-test), declared once: --backend
// cpu|cuda (default cpu), --cuda (= --backend cuda) and --cpu (= --backend cpu). A name other
// than cpu or cuda is refused by the parser (exit 2, naming the choices); flags that name two
// different backends are refused by backend() (UsageError, exit 2).
#include <CLI/CLI.hpp>
#include <string>

#include "runtime/device_weights.h"

namespace ds4::tools {

struct BackendFlags {
    bool cpu = false, cuda = false;
    std::string name;  // --backend NAME; "" when not given

    // The backend the flags name: cpu when none is given. Throws UsageError when they name two
    // (e.g. --cpu --cuda, --backend cpu --cuda).
    runtime::Backend backend() const;
};

// Adds --backend NAME, --cuda and --cpu to `app`, writing to `flags`.
void add_backend_options(CLI::App &app, BackendFlags &flags);

}  // namespace ds4::tools

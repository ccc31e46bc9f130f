#pragma once
// The backend flags of the engine tools (ds4, ds4-bench, ds4-test, ds4-server), declared once:
// --backend cpu|cuda (default cpu), --cuda (= --backend cuda) and --cpu (= --backend cpu), and
// the placement of the layers: --gpus LIST (CUDA devices, one range of layers each; implies
// --cuda) and --layer-split LIST (where the ranges start). A name other than cpu or cuda is
// refused by the parser (exit 2, naming the choices); flags that name two different backends
// are refused by backend(), malformed lists by placement() (UsageError, exit 2).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/device_weights.h"
#include "runtime/gpu_placement.h"

namespace ds4::tools {

// runtime::ModelOptions' gpus and layer_starts.
struct LayerPlacement {
    std::vector<int> gpus;
    std::vector<uint32_t> layer_starts;
    runtime::GpuSplit split = runtime::GpuSplit::Layers;
};

struct BackendFlags {
    bool cpu = false, cuda = false;
    std::string name;         // --backend NAME; "" when not given
    std::string gpus;         // --gpus LIST
    std::string layer_split;  // --layer-split LIST
    std::string split;        // --split layers|tensors

    // The backend the flags name: cpu when none is given. Throws UsageError when they name two
    // (e.g. --cpu --cuda, --backend cpu --cuda, --cpu --gpus 0,1).
    runtime::Backend backend() const;
    // --gpus, --layer-split and --split. Throws UsageError for an entry that is not a number, a
    // device ordinal above 1023, split layers that are 0 or not ascending, --split tensors
    // without two or more --gpus or with --layer-split.
    LayerPlacement placement() const;
};

// Adds --backend NAME, --cuda and --cpu to `app`, writing to `flags`.
void add_backend_options(CLI::App &app, BackendFlags &flags);

}  // namespace ds4::tools

#pragma once
// The SSD-streaming flags of the engine tools (ds4, ds4-bench, ds4-test), declared once, and the
// lines they print about it (docs/CLI.md, docs/SSD_STREAMING.md):
//   --ssd-streaming                       stream the routed experts from the model file
//   --ssd-streaming-cache-experts B       the cache (CUDA: the device tier): N experts, N% of
//                                         them, NGB / NMB, or auto (the default: MemAvailable -
//                                         resident - a margin; CUDA: free device memory - 4 GiB
//                                         - 5% of the device)
//   --ssd-streaming-host-cache B          CUDA: the host tier feeding the device tier (auto:
//                                         the file's mapping on tmpfs or ramfs, else as the CPU
//                                         cache's), or mapped (the file's mapping)
//   --ssd-streaming-cold                  no preload at start
//   --ssd-streaming-preload-experts N     preload at most N experts (default: the cache, <= 4096)
//   --ssd-streaming-cache-dir DIR         where the routing popularity is kept
//   --ssd-streaming-reader auto|io_uring|pool, --ssd-streaming-buffered (no O_DIRECT)
// A bad value is refused by the parser (exit 2, naming the forms); the floor is checked when the
// model loads (exit 2 with the floor stated).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "experts/expert_budget.h"
#include "runtime/session.h"

namespace ds4::tools {

// "2427", "10%" (of the routed experts), "16GB" / "16G" / "16GiB", "512MB" / "512M" / "512MiB"
// (GB and MB mean GiB and MiB, as in the reference; a fraction is allowed for sizes and shares),
// "auto" (case-insensitive). Throws UsageError naming the forms, after `flag` (host_forms: the
// host tier's, which name `mapped` too; the caller handles that one).
experts::ExpertBudget parse_cache_budget(const std::string &text,
                                         const std::string &flag = "--ssd-streaming-cache-experts",
                                         bool host_forms = false);

struct SsdStreamingFlags {
    bool on = false, cold = false, buffered = false;
    std::string budget = "auto", host_budget = "auto", cache_dir, reader = "auto";
    int64_t preload = -1;  // -1: not given
    CLI::Option *budget_opt = nullptr, *host_budget_opt = nullptr, *preload_opt = nullptr,
                *cache_dir_opt = nullptr, *reader_opt = nullptr;

    // The model options for `model_path` on `backend`. Throws UsageError for a streaming flag
    // without --ssd-streaming, --ssd-streaming-cold with --ssd-streaming-preload-experts,
    // --ssd-streaming-host-cache on the CPU backend, a cache folder that is not a folder.
    runtime::StreamingModelOptions options(runtime::Backend backend,
                                           const std::string &model_path) const;
};

void add_ssd_streaming_options(CLI::App &app, SsdStreamingFlags &flags);

// The default folder of the popularity files: $XDG_CACHE_HOME/ds4cpp, else ~/.cache/ds4cpp, else
// "" (none).
std::string default_cache_dir();

// Prints the start-up lines of a streaming model ("<tool>: SSD streaming cache budget ..."); none
// for a resident one.
void print_ssd_streaming_startup(const std::string &tool, runtime::Model &model);
// At exit: "<tool>: SSD streaming stats: ..." and the popularity saved (or why not).
void finish_ssd_streaming(const std::string &tool, runtime::Model &model);

// Calls finish_ssd_streaming when it goes out of scope, however the run ends (an error in it
// included); never throws.
class SsdStreamingAtExit {
  public:
    SsdStreamingAtExit(std::string tool, runtime::Model &model)
        : tool_(std::move(tool)), model_(model) {}
    ~SsdStreamingAtExit();
    SsdStreamingAtExit(const SsdStreamingAtExit &) = delete;
    SsdStreamingAtExit &operator=(const SsdStreamingAtExit &) = delete;

  private:
    std::string tool_;
    runtime::Model &model_;
};

}  // namespace ds4::tools

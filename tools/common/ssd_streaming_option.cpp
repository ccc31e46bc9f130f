#include "ssd_streaming_option.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "cli_app.h"
#include "exit_codes.h"
#include "memory_check.h"

namespace ds4::tools {
namespace {

constexpr const char *kForms =
    "a count of experts (N), a share of them (N%), a size (NGB or NMB, GiB or MiB) or auto";
constexpr const char *kHostForms =
    "a count of experts (N), a share of them (N%), a size (NGB or NMB, GiB or MiB), auto or "
    "mapped";
// --ssd-streaming-host-cache only: the host tier is the model file's mapping.
constexpr const char *kMapped = "mapped";

std::string lower(std::string s) {
    for (char &c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

bool ends_with(const std::string &s, const std::string &suffix) {
    return s.size() > suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

experts::ExpertBudget parse_cache_budget(const std::string &text, const std::string &flag,
                                         bool host_forms) {
    const std::string t = lower(text);
    auto bad = [&] {
        return UsageError(fmt::format("{}: must be {}, got {}", flag,
                                      host_forms ? kHostForms : kForms, quoted_arg(text)));
    };
    if (t == "auto") return {};
    if (ends_with(t, "%")) {
        const std::string num = t.substr(0, t.size() - 1);
        for (char c : num)
            if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.') throw bad();
        char *end = nullptr;
        const double v = std::strtod(num.c_str(), &end);
        if (end != num.c_str() + num.size() || !(v > 0) || v > 100)
            throw UsageError(
                fmt::format("{}: a share must be more than 0% and at most 100%, got {}", flag,
                            quoted_arg(text)));
        return {.experts = 0, .percent = v, .bytes = 0};
    }
    double unit = 0;
    std::string num = t;
    for (const auto &[suffix, u] : {std::pair<const char *, double>{"gib", 1024.0 * 1024 * 1024},
                                    {"gb", 1024.0 * 1024 * 1024},
                                    {"g", 1024.0 * 1024 * 1024},
                                    {"mib", 1024.0 * 1024},
                                    {"mb", 1024.0 * 1024},
                                    {"m", 1024.0 * 1024}}) {
        if (ends_with(t, suffix)) {
            unit = u;
            num = t.substr(0, t.size() - std::string(suffix).size());
            break;
        }
    }
    if (num.empty()) throw bad();
    if (unit == 0) {  // a count: digits only
        for (char c : num)
            if (!std::isdigit(static_cast<unsigned char>(c))) throw bad();
        if (num.size() > 12) throw bad();
        const uint64_t n = std::stoull(num);
        if (n == 0) throw UsageError(fmt::format("{}: must be at least 1 expert, got 0", flag));
        return {.experts = n, .percent = 0, .bytes = 0};
    }
    for (char c : num)
        if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.') throw bad();
    char *end = nullptr;
    const double v = std::strtod(num.c_str(), &end);
    if (end != num.c_str() + num.size() || !std::isfinite(v) || v > 1e7) throw bad();
    const double bytes = v * unit;
    if (bytes < 1)
        throw UsageError(
            fmt::format("{}: must be more than 0 bytes, got {}", flag, quoted_arg(text)));
    return {.experts = 0, .percent = 0, .bytes = uint64_t(bytes)};
}

std::string default_cache_dir() {
    if (const char *x = std::getenv("XDG_CACHE_HOME"); x && *x == '/')
        return std::string(x) + "/ds4cpp";
    if (const char *h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/ds4cpp";
    return "";
}

runtime::StreamingModelOptions SsdStreamingFlags::options(runtime::Backend backend,
                                                          const std::string &model_path) const {
    runtime::StreamingModelOptions o;
    if (!on) {
        const std::pair<bool, const char *> given[] = {
            {budget_opt && budget_opt->count() > 0, "--ssd-streaming-cache-experts"},
            {cold, "--ssd-streaming-cold"},
            {preload_opt && preload_opt->count() > 0, "--ssd-streaming-preload-experts"},
            {cache_dir_opt && cache_dir_opt->count() > 0, "--ssd-streaming-cache-dir"},
            {reader_opt && reader_opt->count() > 0, "--ssd-streaming-reader"},
            {buffered, "--ssd-streaming-buffered"},
            {host_budget_opt && host_budget_opt->count() > 0, "--ssd-streaming-host-cache"}};
        for (const auto &[g, name] : given)
            if (g) throw UsageError(fmt::format("{} needs --ssd-streaming", name));
        return o;
    }
    const bool cuda = backend == runtime::Backend::Cuda;
    if (!cuda && host_budget_opt && host_budget_opt->count() > 0)
        throw UsageError(
            "--ssd-streaming-host-cache sizes the host tier of the CUDA backend; on the CPU "
            "backend the cache is in host memory: use --ssd-streaming-cache-experts");
    if (cold && preload_opt && preload_opt->count() > 0)
        throw UsageError(
            "--ssd-streaming-cold and --ssd-streaming-preload-experts exclude each other");
    o.enabled = true;
    // On CUDA, --ssd-streaming-cache-experts is the device tier and --ssd-streaming-host-cache
    // the host tier that feeds it; on the CPU the one cache.
    if (cuda) {
        o.host_mapped = lower(host_budget) == kMapped;
        if (!o.host_mapped)
            o.budget = parse_cache_budget(host_budget, "--ssd-streaming-host-cache", true);
        o.device = parse_cache_budget(budget);
        o.host_tier = true;
    } else {
        o.budget = parse_cache_budget(budget);
    }
    if (o.budget.automatic() && !o.host_mapped) o.mem_available = mem_available_bytes().value_or(0);
    o.direct_io = !buffered;
    o.reader.kind = reader == "pool"       ? experts::ReaderKind::Pool
                    : reader == "io_uring" ? experts::ReaderKind::IoUring
                                           : experts::ReaderKind::Auto;
    o.preload = !cold;
    o.preload_experts = preload;
    const std::string dir =
        cache_dir_opt && cache_dir_opt->count() > 0 ? cache_dir : default_cache_dir();
    std::error_code ec;
    if (!dir.empty() && std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
        throw UsageError(fmt::format("--ssd-streaming-cache-dir {} is not a folder", dir));
    if (!dir.empty()) {
        try {
            o.popularity_file = runtime::popularity_file_for(dir, model_path);
        } catch (const Error &) {
            o.popularity_file.clear();  // the model cannot be stat'ed: its load says why
        }
    }
    return o;
}

namespace {

// CLI11's check of a budget flag: parse_cache_budget's message without the flag's name (CLI11
// names the option itself).
CLI::Validator budget_validator(const std::string &flag, bool mapped = false) {
    return CLI::Validator(
        [flag, mapped](std::string &s) -> std::string {
            if (mapped && lower(s) == kMapped) return "";
            try {
                (void)parse_cache_budget(s, flag, mapped);
            } catch (const UsageError &e) {
                std::string m = e.what();
                const std::string prefix = flag + ": ";
                return m.rfind(prefix, 0) == 0 ? m.substr(prefix.size()) : m;
            }
            return "";
        },
        mapped ? "N|N%|NGB|NMB|auto|mapped" : "N|N%|NGB|NMB|auto");
}

}  // namespace

void add_ssd_streaming_options(CLI::App &app, SsdStreamingFlags &f) {
    app.add_flag("--ssd-streaming", f.on,
                 "Stream the routed experts from the model file through a bounded cache; the "
                 "other weights stay mapped (CPU) or go to the device (CUDA, where the cache is a "
                 "device tier fed by a host tier)");
    f.budget_opt =
        app.add_option("--ssd-streaming-cache-experts", f.budget,
                       "SSD streaming cache (CUDA: the device tier): N experts, N% of the routed "
                       "experts, NGB or NMB (GiB, MiB), or auto (the default; CPU: MemAvailable "
                       "minus the resident weights minus a margin of a tenth, at least 1 GiB; "
                       "CUDA: the device memory free after the other weights minus 4 GiB and "
                       "5% of the device, for sessions); "
                       "below the floor (one token's experts of one layer) the load is refused")
            ->check(budget_validator("--ssd-streaming-cache-experts"));
    f.host_budget_opt =
        app.add_option("--ssd-streaming-host-cache", f.host_budget,
                       "SSD streaming on CUDA: the host tier (pinned host memory between the "
                       "disk and the device tier), in the forms of --ssd-streaming-cache-experts, "
                       "or mapped: the model file's own mapping, for a file already in memory "
                       "(no copy; the device tier's misses come from its pages); auto (the "
                       "default): mapped for a file on tmpfs or ramfs, else as the CPU cache's "
                       "auto")
            ->check(budget_validator("--ssd-streaming-host-cache", true));
    app.add_flag("--ssd-streaming-cold", f.cold,
                 "SSD streaming: preload nothing at start (the cache fills as experts are used)");
    f.preload_opt = app.add_option("--ssd-streaming-preload-experts", f.preload,
                                   "SSD streaming: preload at most N experts, the most popular "
                                   "first (default: as many as the cache holds, at most 4096)")
                        ->check(integer_in(0, int64_t(1) << 31));
    f.cache_dir_opt = app.add_option(
        "--ssd-streaming-cache-dir", f.cache_dir,
        "SSD streaming: folder of the routing popularity files, one per model file identity "
        "(default: $XDG_CACHE_HOME/ds4cpp, else ~/.cache/ds4cpp)");
    f.reader_opt = app.add_option("--ssd-streaming-reader", f.reader,
                                  "SSD streaming reads: auto (io_uring when it works, else the "
                                  "pread pool, with a notice), io_uring or pool")
                       ->check(CLI::IsMember({"auto", "io_uring", "pool"}));
    app.add_flag("--ssd-streaming-buffered", f.buffered,
                 "SSD streaming: buffered reads instead of O_DIRECT (the page cache then holds "
                 "a second copy of the experts read)");
}

void print_ssd_streaming_startup(const std::string &tool, runtime::Model &model) {
    if (runtime::ExpertStreaming *s = model.streaming())
        for (const std::string &line : s->log()) fmt::print(stderr, "{}: {}\n", tool, line);
    if (runtime::DeviceWeights *d = model.device())
        for (const std::string &line : d->tier_log()) fmt::print(stderr, "{}: {}\n", tool, line);
}

void finish_ssd_streaming(const std::string &tool, runtime::Model &model) {
    runtime::ExpertStreaming *s = model.streaming();
    if (!s) return;
    const runtime::DeviceWeights *d = model.device();
    if (const auto tier = d ? d->tier_stats() : std::nullopt)
        fmt::print(stderr, "{}: SSD streaming device tier stats: {}\n", tool,
                   runtime::device_tier_stats_text(*tier));
    fmt::print(stderr, "{}: SSD streaming {}stats: {}\n", tool, d ? "host tier " : "",
               runtime::streaming_stats_text(s->source().stats()));
    // With a device tier, the run's routing is its selections (the host tier sees its misses).
    const std::vector<uint64_t> counts = d ? d->tier_selection_counts() : std::vector<uint64_t>{};
    fmt::print(stderr, "{}: {}\n", tool, s->save_popularity(counts));
}

SsdStreamingAtExit::~SsdStreamingAtExit() {
    try {
        finish_ssd_streaming(tool_, model_);
    } catch (...) {  // a report at exit must not end the process another way
    }
}

}  // namespace ds4::tools

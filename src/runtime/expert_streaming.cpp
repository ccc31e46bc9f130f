#include "runtime/expert_streaming.h"

#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>

#include "common/error.h"
#include "experts/mapped_source.h"
#include "experts/popularity.h"
#include "gguf/gguf_file.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/device_weights.h"

namespace ds4::runtime {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024, kMiB = 1024.0 * 1024;
// The reference caps its popularity hot-list at 4096 experts.
constexpr uint64_t kDefaultPreloadCap = 4096;

uint64_t fnv1a(const std::string &s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ull;
    }
    return h;
}

std::string size_text(double bytes) {
    return bytes >= kGiB ? fmt::format("{:.2f} GiB", bytes / kGiB)
                         : fmt::format("{:.2f} MiB", bytes / kMiB);
}

// Without a saved popularity: per layer, the experts the router itself favours first. Score-routed
// layers rank by their selection bias (exp_probs_b), hash layers by how many token ids the table
// sends to each expert; a layer with neither keeps the expert order. Rank r becomes the count
// n_expert - r, so popular_first interleaves the layers' favourites.
std::vector<uint64_t> router_counts(const model::HParams &hp, const model::ModelWeights &w) {
    const uint32_t n_expert = hp.n_expert;
    std::vector<uint64_t> counts(size_t(hp.n_layer) * n_expert, 0);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const model::LayerWeights &L = w.layers[il];
        std::vector<double> score(n_expert, 0.0);
        if (L.tid2eid) {
            const auto *ids = reinterpret_cast<const int32_t *>(L.tid2eid->data);
            const uint64_t n = L.tid2eid->ne[0] * L.tid2eid->ne[1];
            for (uint64_t i = 0; i < n; ++i)
                if (ids[i] >= 0 && uint32_t(ids[i]) < n_expert) score[ids[i]] += 1;
        } else if (L.exp_probs_b) {
            const auto *b = reinterpret_cast<const float *>(L.exp_probs_b->data);
            for (uint32_t e = 0; e < n_expert; ++e) score[e] = b[e];
        }
        std::vector<uint32_t> order(n_expert);
        std::iota(order.begin(), order.end(), 0u);
        std::stable_sort(order.begin(), order.end(),
                         [&](uint32_t a, uint32_t b) { return score[a] > score[b]; });
        for (uint32_t r = 0; r < n_expert; ++r)
            counts[size_t(il) * n_expert + order[r]] = n_expert - r;
    }
    return counts;
}

// A page fault on the mapping makes the kernel read around it (read_ahead_kb on each side, often
// several MiB), which would pull the routed experts next to every non-routed tensor into the page
// cache. The mapping is therefore marked random (a fault reads its own page only) and the ranges
// that are not routed experts (header, non-routed tensors) are read ahead explicitly, exactly.
// Both are advice: a failure changes speed, not results.
void advise_mapping(const gguf::File &file, const model::ModelWeights &w) {
    const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
    auto *base = const_cast<uint8_t *>(file.base());
    if (base == nullptr || file.file_size() == 0) return;
    (void)::madvise(base, file.file_size(), MADV_RANDOM);
    std::vector<std::pair<uint64_t, uint64_t>> routed;  // file byte ranges, sorted below
    for (const model::LayerWeights &L : w.layers)
        for (const model::Tensor t : {L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps}) {
            const uint64_t off = uint64_t(t->data - file.base());
            routed.emplace_back(off, off + t->n_bytes);
        }
    std::sort(routed.begin(), routed.end());
    uint64_t pos = 0;
    auto will_need = [&](uint64_t a, uint64_t b) {
        a = a / page * page;  // the page holding the first byte
        b = std::min(file.file_size(), (b + page - 1) / page * page);
        if (b > a) (void)::madvise(base + a, b - a, MADV_WILLNEED);
    };
    for (const auto &[a, b] : routed) {
        if (a > pos) will_need(pos, a);
        pos = std::max(pos, b);
    }
    if (file.file_size() > pos) will_need(pos, file.file_size());
}

}  // namespace

bool file_in_memory(const std::string &path) {
    struct statfs fs {};
    if (::statfs(path.c_str(), &fs) != 0) return false;
    return fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC;
}

uint64_t auto_margin_bytes(uint64_t mem_available) {
    return std::max<uint64_t>(uint64_t(1) << 30, mem_available / 10);
}

std::string popularity_file_for(const std::string &dir, const std::string &model_path) {
    const std::string identity = experts::file_identity(model_path);
    return fmt::format("{}/{}-{:016x}.popularity", dir,
                       std::filesystem::path(model_path).filename().string(), fnv1a(identity));
}

ExpertStreaming::ExpertStreaming(const gguf::File &file, const model::HParams &hp,
                                 const model::ModelWeights &weights,
                                 const StreamingModelOptions &opts)
    : popularity_file_(opts.popularity_file), n_layer_(hp.n_layer), n_expert_(hp.n_expert) {
    for (const model::LayerWeights &L : weights.layers)
        routed_bytes_ +=
            L.ffn_gate_exps->n_bytes + L.ffn_up_exps->n_bytes + L.ffn_down_exps->n_bytes;
    resident_bytes_ = file.file_size() - std::min(file.file_size(), routed_bytes_);
    const uint64_t n_total = uint64_t(hp.n_layer) * hp.n_expert;
    const char *cache = opts.host_tier ? "host tier" : "cache";

    if (opts.host_mapped && (!opts.host_tier || !opts.budget.automatic()))
        throw Error(
            "SSD streaming: a mapped host tier is the CUDA backend's host tier, without a "
            "budget of its own");
    mapped_ = opts.host_tier &&
              (opts.host_mapped || (opts.budget.automatic() && file_in_memory(file.path())));
    experts::ExpertStats st;
    if (mapped_) {
        source_ = std::make_unique<experts::MappedHostSource>(file, weights);
        st = source_->stats();
        log_.push_back(
            opts.host_mapped
                ? std::string("SSD streaming host tier: the file's mapping "
                              "(--ssd-streaming-host-cache mapped)")
                : fmt::format("SSD streaming host tier auto: {} is on a file system in memory "
                              "(tmpfs or ramfs): the host tier is the file's mapping",
                              file.path()));
        log_.push_back(fmt::format(
            "SSD streaming: resident: the non-routed weights, {} ({} bytes); the routed experts, "
            "{} ({} layers x {} experts x {:.2f} MiB), go to the device tier straight from the "
            "file's pages (no copy in host memory, no reads by the engine)",
            size_text(double(resident_bytes_)), resident_bytes_, size_text(double(routed_bytes_)),
            hp.n_layer, hp.n_expert, double(st.expert_bytes) / kMiB));
        if (opts.reader.kind != experts::ReaderKind::Auto || !opts.direct_io)
            log_.push_back(
                "SSD streaming: notice: the reader's options (--ssd-streaming-reader, "
                "--ssd-streaming-buffered) have no effect: the mapped host tier reads nothing");
    } else {
        experts::StreamingOptions so;
        so.budget = opts.budget;
        so.n_expert_used = hp.n_expert_used;
        so.direct_io = opts.direct_io;
        so.reader = opts.reader;
        so.make_reader = opts.make_reader;
        if (so.budget.automatic()) {
            if (opts.mem_available == 0)
                throw Error(fmt::format(
                    "SSD streaming {} budget auto: the memory available (MemAvailable "
                    "of /proc/meminfo) is unknown; give the budget as a count or a size",
                    cache));
            const uint64_t margin = auto_margin_bytes(opts.mem_available);
            const std::string sum = fmt::format(
                "MemAvailable {} - resident weights {} - margin {} (KV cache, buffers: a tenth of "
                "MemAvailable, at least 1 GiB)",
                size_text(double(opts.mem_available)), size_text(double(resident_bytes_)),
                size_text(double(margin)));
            if (opts.mem_available <= resident_bytes_ + margin)
                throw Error(fmt::format(
                    "SSD streaming {} budget auto: {} leaves no room for it; give the budget as a "
                    "count or a size",
                    cache, sum));
            so.budget.bytes = opts.mem_available - resident_bytes_ - margin;
            log_.push_back(fmt::format("SSD streaming {} budget auto: {} = {}", cache, sum,
                                       size_text(double(so.budget.bytes))));
        }
        auto streaming = std::make_unique<experts::StreamingSource>(file, weights, so);
        advise_mapping(file, weights);
        st = streaming->stats();
        const uint64_t budget = so.budget.experts == 0 && so.budget.percent == 0
                                    ? so.budget.bytes
                                    : so.budget.slots(n_total, st.slot_bytes) * st.slot_bytes;
        log_.push_back(fmt::format(
            "SSD streaming {} budget {} / {:.2f} MiB per expert = {} experts ({:.1f}% of the {} "
            "routed experts{})",
            cache, size_text(double(budget)), double(st.slot_bytes) / kMiB, st.entries,
            100.0 * double(st.entries) / double(n_total), n_total,
            st.entries == n_total ? ": every expert fits" : ""));
        log_.push_back(fmt::format(
            "SSD streaming: resident (mapped): the non-routed weights, {} ({} bytes); streamed: "
            "the routed experts, {} ({} layers x {} experts x {:.2f} MiB), read from the file into "
            "the cache, never through the mapping (no full residency, no warm-up)",
            size_text(double(resident_bytes_)), resident_bytes_, size_text(double(routed_bytes_)),
            hp.n_layer, hp.n_expert, double(st.expert_bytes) / kMiB));
        const bool pool = std::string(st.reader) != "io_uring";
        log_.push_back(fmt::format(
            "SSD streaming: reader {} ({}{} reads in flight), O_DIRECT {}", st.reader,
            pool ? fmt::format("{} threads, ", opts.reader.pool_threads) : std::string(),
            opts.reader.max_in_flight, st.direct_io ? "on" : "off (buffered reads)"));
        for (const std::string &n : streaming->notices())
            log_.push_back("SSD streaming: notice: " + n);
        source_ = std::move(streaming);
    }

    identity_ = experts::file_identity(file.path());
    std::vector<uint64_t> counts;
    std::string from;
    if (!popularity_file_.empty()) {
        experts::LoadedPopularity lp =
            experts::load_popularity(popularity_file_, identity_, n_layer_, n_expert_);
        if (lp.counts) {
            loaded_ = *lp.counts;
            counts = loaded_;
            from = fmt::format("the popularity file {}", popularity_file_);
        } else {
            from = fmt::format("the router's bias and hash tables ({})", lp.notice);
        }
        if (!lp.notice.empty() && lp.counts)
            log_.push_back("SSD streaming: popularity: " + lp.notice);
    } else {
        from = "the router's bias and hash tables (no popularity file)";
    }
    if (!opts.preload) {
        log_.push_back("SSD streaming: cold start (--ssd-streaming-cold): nothing preloaded");
        return;
    }
    const uint64_t want = opts.preload_experts < 0
                              ? std::min<uint64_t>(st.entries, kDefaultPreloadCap)
                              : std::min<uint64_t>(st.entries, uint64_t(opts.preload_experts));
    if (want == 0) {
        log_.push_back("SSD streaming: nothing preloaded (--ssd-streaming-preload-experts 0)");
        return;
    }
    // The saved popularity first; the router's favourites fill what it leaves.
    std::vector<experts::ExpertKey> keys;
    if (!counts.empty()) keys = experts::popular_first(counts, n_expert_, want);
    if (keys.size() < want) {
        std::vector<bool> taken(n_total, false);
        for (const experts::ExpertKey &k : keys)
            taken[size_t(k.layer) * n_expert_ + k.expert] = true;
        for (const experts::ExpertKey &k :
             experts::popular_first(router_counts(hp, weights), n_expert_, n_total)) {
            if (keys.size() >= want) break;
            if (!taken[size_t(k.layer) * n_expert_ + k.expert]) keys.push_back(k);
        }
        if (!counts.empty()) from += " and the router's bias and hash tables";
    }
    preloaded_ = keys;
    if (mapped_) {
        log_.push_back(fmt::format(
            "SSD streaming: the device tier preloads in the order of {} ({} experts at most)", from,
            keys.size()));
        return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    source_->preload(keys);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint64_t n = source_->stats().preloaded;
    const double bytes = double(n) * double(st.expert_bytes);
    log_.push_back(fmt::format(
        "SSD streaming: preloaded {} experts ({}) from {} in {:.2f} s{}", n, size_text(bytes), from,
        s, s > 0.001 ? fmt::format(" ({:.2f} GiB/s)", bytes / kGiB / s) : std::string()));
}

ExpertStreaming::~ExpertStreaming() = default;

std::string ExpertStreaming::save_popularity(std::span<const uint64_t> run_counts) {
    if (popularity_file_.empty()) return "SSD streaming: popularity not saved (no cache folder)";
    try {
        std::vector<uint64_t> counts =
            run_counts.empty() ? source_->selection_counts()
                               : std::vector<uint64_t>(run_counts.begin(), run_counts.end());
        uint64_t selected = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
            selected += counts[i];
            if (i < loaded_.size())
                counts[i] =
                    counts[i] > UINT64_MAX - loaded_[i] ? UINT64_MAX : counts[i] + loaded_[i];
        }
        if (selected == 0) return "SSD streaming: popularity not saved (no expert was selected)";
        experts::save_popularity(popularity_file_, {.identity = identity_,
                                                    .n_layer = n_layer_,
                                                    .n_expert = n_expert_,
                                                    .counts = std::move(counts)});
        return fmt::format("SSD streaming: popularity saved to {} ({} selections this run)",
                           popularity_file_, selected);
    } catch (const std::exception &e) {
        return fmt::format("SSD streaming: popularity not saved: {}", e.what());
    }
}

std::string streaming_stats_text(const experts::ExpertStats &s) {
    const double hit_rate = s.gets ? 100.0 * double(s.hits) / double(s.gets) : 0.0;
    const double busy_s = double(s.io_busy_ns) / 1e9;
    const std::string bw =
        busy_s > 0 ? fmt::format("{:.2f} GiB/s", double(s.disk_bytes) / kGiB / busy_s) : "-";
    return fmt::format(
        "{} entries, {} hits, {} misses, hit rate {:.2f}%, {} bytes read ({}), read bandwidth "
        "during misses {}, I/O wait {:.3f} s, preloaded {}, prefetched unused {}",
        s.entries, s.hits, s.misses, hit_rate, s.bytes_read, size_text(double(s.bytes_read)), bw,
        double(s.io_wait_ns) / 1e9, s.preloaded, s.prefetch_unused);
}

}  // namespace ds4::runtime

namespace ds4::runtime {

std::string device_tier_stats_text(const DeviceTierStats &s) {
    const double hit_rate = s.acquires ? 100.0 * double(s.hits) / double(s.acquires) : 0.0;
    const double wait_s = double(s.upload_wait_ns) / 1e9;
    return fmt::format(
        "{} slots ({}), {} passes, {} experts: {} hits, {} misses, hit rate {:.2f}%, {} uploaded, "
        "host blocked on transfers {:.3f} s, preloaded {}, hits first in {} passes",
        s.slots, size_text(double(s.slots * s.slot_bytes)), s.passes, s.acquires, s.hits, s.misses,
        hit_rate, size_text(double(s.bytes_uploaded)), wait_s, s.preloaded, s.hits_first);
}

}  // namespace ds4::runtime

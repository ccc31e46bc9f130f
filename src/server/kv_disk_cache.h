#pragma once
// ds4-server's disk KV cache (docs/SERVER.md, Disk KV cache): a directory of checkpoint files
// (kv_disk_format.h), each a session's state at some token prefix, that outlive the process. It
// indexes the directory at start (rejecting, logging and deleting files that are damaged, of
// another model, or of a larger context, and removing the temp files of writers that died),
// finds the longest checkpoint that is a prefix of a prompt and restores it after verifying the
// whole file, writes checkpoints atomically (temp file, fsync, rename, fsync of the directory),
// and keeps the directory under a byte budget, dropping the least recently used first. When to
// save is the engine's (Engine::run); where the save points fall is here (save_points).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_file.h"
#include "runtime/session.h"
#include "server/kv_disk_format.h"

namespace ds4::server {

struct KvDiskOptions {
    std::string dir;                           // created (mode 0700) when missing
    uint64_t budget_bytes = 4096ull << 20;     // --kv-disk-space-mb
    size_t min_tokens = 512;                   // never save or load a shorter checkpoint
    size_t cold_max_tokens = 30000;            // cold saves for prompts up to this; 0 = none
    size_t continued_interval_tokens = 10000;  // continued saves every this (aligned); 0 = none
    size_t boundary_align_tokens = 2048;       // cold and continued points aligned down/up to this
    size_t boundary_trim_tokens = 32;          // tail tokens left out of a cold save point
};

// What checkpoints are keyed to besides their tokens: a hash (FNV-1a, 64 bit) of the GGUF's
// metadata and tensor directory (bytes 0 .. data_offset: names, shapes, types, so the
// routed-expert quant type too), the first 4 KiB of every tensor but the routed experts' (so two
// files of one layout with other weights differ; the experts are skipped because SSD streaming
// never reads them through the mapping), and `config` (what else changes the state's bits, such
// as the row format).
uint64_t model_identity(const gguf::File &file, std::string_view config);

class KvDiskCache {
  public:
    using Log = std::function<void(const std::string &)>;

    // Opens and indexes opts.dir for checkpoints of `model_id` loadable into sessions of `ctx`;
    // then evicts down to the budget. Throws ds4::Error when the directory cannot be made or
    // written. `log` gets one line per event (stored, loaded, rejected, evicted).
    KvDiskCache(KvDiskOptions opts, uint64_t model_id, uint32_t ctx, Log log);
    ~KvDiskCache();
    KvDiskCache(const KvDiskCache &) = delete;
    KvDiskCache &operator=(const KvDiskCache &) = delete;

    const KvDiskOptions &options() const { return opts_; }

    // Where the prefill of a prompt of `len` tokens, resumed at `cached`, stops to save, in
    // increasing order, each in (cached, len]: a cold point when nothing was reused (cached 0)
    // and min <= len <= cold max (len aligned down to the boundary, or len when that is below
    // min), and every multiple of the continued step (the interval rounded up to the boundary).
    struct SavePoint {
        size_t at;
        KvSaveReason reason;
    };
    std::vector<SavePoint> save_points(size_t cached, size_t len) const;
    // Whether a session of n tokens (during generation) is at a continued point.
    bool continued_point(size_t n) const;

    // Restores into `session` the longest checkpoint longer than `longer_than` tokens whose tokens
    // are a prefix of `prompt`, after checking the whole file (header, size, checksum, then
    // Session::read_state's own checks). A file that fails is logged and deleted and the next
    // longest tried. tokens: those restored (0: none, the session as it was unless
    // session_changed, which means a state was read but then found inconsistent: the caller must
    // reset the session). Never throws for a file's defects.
    struct Loaded {
        size_t tokens = 0;
        bool session_changed = false;
    };
    Loaded load(std::span<const int32_t> prompt, size_t longer_than, runtime::Session &session);

    // Writes a checkpoint of the session's state, unless it holds fewer than min tokens or a
    // checkpoint of the same tokens exists (then that one counts as used); then evicts down to
    // the budget (never the new file unless it alone is over it). Returns whether it wrote one.
    // Failures (disk full, a backend that cannot serialise) are logged, not thrown.
    bool store(const runtime::Session &session, KvSaveReason reason);

    size_t files() const;
    uint64_t bytes() const;

  private:
    struct Entry {
        std::string name;
        std::vector<int32_t> tokens;
        uint64_t bytes = 0;
        int64_t last_used = 0;  // ns since the epoch: the file's mtime, set at each use
    };
    void index();
    void reject_locked(const std::string &name, const std::string &why);
    void evict_locked(const std::string &keep);
    void touch_locked(Entry &e);
    std::string path(const std::string &name) const { return opts_.dir + "/" + name; }

    KvDiskOptions opts_;
    uint64_t model_id_;
    uint32_t ctx_;
    Log log_;
    int dir_fd_ = -1;
    uint64_t pause_after_bytes_ = 0;  // DS4_KV_DISK_TEST_PAUSE_AFTER_BYTES (tests only)
    mutable std::mutex mu_;
    std::vector<Entry> entries_;
    uint64_t seq_ = 0;
};

}  // namespace ds4::server

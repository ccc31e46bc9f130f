#include "experts/streaming_source.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "gguf/gguf_file.h"
#include "model/weights.h"

namespace ds4::experts {
namespace {

constexpr const char *kSlabName[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
// Buffered reads land at this alignment (a cache line, and any SIMD load the kernels use).
constexpr uint64_t kBufferedAlign = 64;

uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}
uint64_t align_down(uint64_t x, uint64_t a) {
    return x / a * a;
}

model::Tensor slab_tensor(const model::LayerWeights &L, int i) {
    return i == 0 ? L.ffn_gate_exps : i == 1 ? L.ffn_up_exps : L.ffn_down_exps;
}

uint64_t region_bytes(uint64_t slab, bool direct) {
    // An aligned superset of a slab that starts r bytes past a block boundary is
    // align_up(r + slab) long, at most align_up(slab + align - 1).
    return direct ? align_up(slab + kDirectAlign - 1, kDirectAlign)
                  : align_up(slab, kBufferedAlign);
}

double mib(uint64_t bytes) {
    return double(bytes) / (1024.0 * 1024.0);
}

// The slots the options ask for, refused below the floor.
uint32_t slot_count(const StreamingOptions &opts, uint64_t slot_bytes, uint64_t n_total) {
    if (opts.n_expert_used == 0)
        throw Error(
            "SSD streaming: the floor (n_expert_used, one token's experts of one layer) "
            "was not given");
    if (opts.budget.automatic())
        throw Error("SSD streaming: no cache budget given (experts, a share or bytes)");
    const uint64_t budget = opts.budget.slots(n_total, slot_bytes);
    const uint64_t floor = opts.n_expert_used;
    if (budget < floor)
        throw Error(fmt::format(
            "SSD streaming cache budget of {} experts ({:.2f} MiB at {:.2f} MiB per expert) is "
            "below the floor of {} experts ({:.2f} MiB): one token's {} experts of one layer "
            "must fit",
            budget, mib(budget * slot_bytes), mib(slot_bytes), floor, mib(floor * slot_bytes),
            floor));
    // More slots than experts would never be used.
    return static_cast<uint32_t>(std::min(budget, n_total));
}

uint64_t elapsed_ns(std::chrono::steady_clock::time_point t0) {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count());
}

}  // namespace

uint64_t ExpertGeometry::slot_bytes(bool direct) const {
    return region_bytes(gate, direct) + region_bytes(up, direct) + region_bytes(down, direct);
}

ExpertGeometry expert_geometry(const model::ModelWeights &w) {
    if (w.layers.empty()) throw Error("SSD streaming: the model has no layers");
    ExpertGeometry g0;
    for (size_t il = 0; il < w.layers.size(); ++il) {
        uint64_t bytes[3];
        for (int i = 0; i < 3; ++i) {
            const model::Tensor t = slab_tensor(w.layers[il], i);
            if (!t || t->ne.size() != 3 || t->ne[2] == 0 || t->n_bytes % t->ne[2] != 0)
                throw Error(fmt::format("SSD streaming: layer {} has no [K, N, n_expert] {}", il,
                                        kSlabName[i]));
            if (t->ne[2] != slab_tensor(w.layers[0], 0)->ne[2])
                throw Error(fmt::format("SSD streaming: layer {} {} has {} experts, layer 0 {}", il,
                                        kSlabName[i], t->ne[2],
                                        slab_tensor(w.layers[0], 0)->ne[2]));
            bytes[i] = t->n_bytes / t->ne[2];
        }
        const ExpertGeometry g{bytes[0], bytes[1], bytes[2]};
        if (il == 0) {
            g0 = g;
        } else if (g.gate != g0.gate || g.up != g0.up || g.down != g0.down) {
            // One slot size serves every layer; a file mixing expert types per layer would need
            // slots of the largest size.
            throw Error(fmt::format(
                "SSD streaming: layer {} experts are {}+{}+{} bytes (gate+up+down), layer 0's "
                "{}+{}+{}: streaming needs equal expert sizes in every layer",
                il, g.gate, g.up, g.down, g0.gate, g0.up, g0.down));
        }
    }
    return g0;
}

StreamingSource::SlotMemory::SlotMemory(uint64_t bytes) : n_(bytes) {
    void *p = ::mmap(nullptr, n_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        throw Error(fmt::format("SSD streaming: cannot allocate the cache's {} bytes: {}", n_,
                                std::strerror(errno)));
    p_ = static_cast<uint8_t *>(p);
}

StreamingSource::SlotMemory::~SlotMemory() {
    if (p_) ::munmap(p_, n_);
}

StreamingSource::StreamingSource(const gguf::File &file, const model::ModelWeights &weights,
                                 const StreamingOptions &opts)
    : geom_(expert_geometry(weights)),
      n_layer_(static_cast<uint32_t>(weights.layers.size())),
      n_expert_(static_cast<uint32_t>(weights.layers[0].ffn_gate_exps->ne[2])),
      file_(file.path(), opts.direct_io),
      slot_bytes_(geom_.slot_bytes(file_.direct())),
      cache_(n_layer_, n_expert_, slot_count(opts, slot_bytes_, uint64_t(n_layer_) * n_expert_)),
      memory_(uint64_t(cache_.n_slots()) * slot_bytes_),
      decay_interval_(opts.decay_interval) {
    if (!file_.notice().empty()) notices_.push_back(file_.notice());
    const uint64_t slabs[3] = {geom_.gate, geom_.up, geom_.down};
    for (int i = 0; i < 3; ++i) region_[i] = region_bytes(slabs[i], file_.direct());

    // File offsets of the routed tensors, from the tensor table (their bytes are not touched).
    uint64_t end = 0;
    files_.resize(n_layer_);
    for (uint32_t il = 0; il < n_layer_; ++il) {
        for (int i = 0; i < 3; ++i) {
            const model::Tensor t = slab_tensor(weights.layers[il], i);
            const uint64_t off = file.data_offset() + t->offset;
            if (t->data != file.base() + off)
                throw Error(fmt::format("SSD streaming: layer {} {} is not bound to {}", il,
                                        kSlabName[i], file.path()));
            files_[il].offset[i] = off;
            end = std::max(end, off + t->n_bytes);
        }
    }
    if (const uint64_t size = file_.size(); size < end)
        throw Error(
            fmt::format("{}: the file is {} bytes but its routed experts end at byte {}: "
                        "truncated?",
                        file_.path(), size, end));

    if (opts.make_reader) {
        reader_ = opts.make_reader(file_.fd());
    } else {
        OpenedReader r = make_reader(file_.fd(), opts.reader);
        reader_ = std::move(r.reader);
        if (!r.notice.empty()) notices_.push_back(r.notice);
    }
    if (!reader_) throw Error("SSD streaming: no reader");

    slots_.resize(cache_.n_slots());
    passes_.resize(n_layer_);
    stats_.streaming = true;
    stats_.reader = reader_->name();
    stats_.direct_io = file_.direct();
    stats_.entries = cache_.n_slots();
    stats_.expert_bytes = geom_.payload();
    stats_.slot_bytes = slot_bytes_;
}

StreamingSource::~StreamingSource() = default;

void StreamingSource::check_key(uint32_t layer, uint32_t expert) const {
    if (layer >= n_layer_ || expert >= n_expert_)
        throw Error(
            fmt::format("SSD streaming: layer {} expert {} out of range ({} layers x {} "
                        "experts)",
                        layer, expert, n_layer_, n_expert_));
}

ExpertBytes StreamingSource::get(uint32_t layer, uint32_t expert) {
    std::lock_guard lk(m_);
    check_key(layer, expert);
    ++tick_;
    cache_.select(layer, expert);
    release_held(layer);  // the previous get's bytes of this layer end here (the contract)

    int32_t s = cache_.slot_of(layer, expert);
    if (s == ExpertCache::kNone) {
        s = claim_slot(layer);
        start_load(s, layer, expert);
    } else if (slots_[s].prefetch_pin) {
        slots_[s].prefetch_pin = false;
        cache_.unpin(s);
    }
    cache_.pin(s);
    passes_[layer].held = s;
    cache_.touch(s, tick_);
    top_up(layer);  // keep the announced reads in flight while this one is awaited

    if (slots_[s].state == State::Reading) {
        const auto t0 = std::chrono::steady_clock::now();
        try {
            wait_ready(s);
        } catch (...) {
            stats_.io_wait_ns += elapsed_ns(t0);
            passes_[layer].held = ExpertCache::kNone;
            cache_.unpin(s);
            throw;
        }
        stats_.io_wait_ns += elapsed_ns(t0);
    }
    Slot &slot = slots_[s];
    ++stats_.gets;
    if (slot.fresh) {
        slot.fresh = false;
        ++stats_.misses;
        stats_.bytes_read += geom_.payload();
    } else {
        ++stats_.hits;
    }
    return bytes_of(s);
}

void StreamingSource::prefetch(uint32_t layer, std::span<const uint32_t> experts) {
    std::lock_guard lk(m_);
    if (layer >= n_layer_) check_key(layer, 0);
    for (uint32_t e : experts) check_key(layer, e);
    release_pass(layer);  // a new pass replaces the announcement of the last one
    Pass &p = passes_[layer];
    p.experts.assign(experts.begin(), experts.end());
    p.next = 0;
    top_up(layer);
}

void StreamingSource::layer_done(uint32_t layer) {
    std::lock_guard lk(m_);
    if (layer >= n_layer_) check_key(layer, 0);
    release_held(layer);
    release_pass(layer);
}

void StreamingSource::step_done() {
    std::lock_guard lk(m_);
    for (uint32_t il = 0; il < n_layer_; ++il) {
        release_held(il);
        release_pass(il);
    }
    ++steps_;
    if (decay_interval_ != 0 && steps_ % decay_interval_ == 0) cache_.decay();
}

void StreamingSource::preload(std::span<const ExpertKey> keys) {
    std::lock_guard lk(m_);
    for (const ExpertKey &k : keys) check_key(k.layer, k.expert);
    // Only empty slots are filled: a preload never evicts. The first keys are the most wanted, so
    // they count as the most recently used: among never-selected experts the least wanted go first.
    std::vector<int32_t> loading;
    for (const ExpertKey &k : keys) {
        if (cache_.slot_of(k.layer, k.expert) != ExpertCache::kNone) continue;
        const int32_t s = cache_.victim();
        if (s == ExpertCache::kNone || !cache_.empty(s)) break;
        start_load(s, k.layer, k.expert);
        slots_[s].fresh = false;
        loading.push_back(s);
    }
    std::string first_error;
    for (size_t i = 0; i < loading.size(); ++i) {
        const int32_t s = loading[i];
        cache_.touch(s, tick_ + loading.size() - i);
        try {
            wait_ready(s);
            ++stats_.preloaded;
        } catch (const Error &e) {
            if (first_error.empty()) first_error = e.what();
        }
    }
    tick_ += loading.size();
    if (!first_error.empty()) throw Error(first_error);
}

std::vector<uint64_t> StreamingSource::selection_counts() const {
    std::lock_guard lk(m_);
    return cache_.selection_counts();
}

ExpertStats StreamingSource::stats() const {
    std::lock_guard lk(m_);
    ExpertStats s = stats_;
    s.disk_bytes = reader_->bytes_transferred();
    s.io_busy_ns = reader_->busy_ns();
    return s;
}

// A slot for a get's expert: the cache's victim, emptied. When every slot is pinned, an announced
// expert gives its slot up (its get will read it again: no consumer has its bytes yet), another
// layer's first, the latest announced first. Throws when every slot is held by a get.
int32_t StreamingSource::claim_slot(uint32_t layer) {
    int32_t s = cache_.victim();
    for (uint32_t k = 1; s == ExpertCache::kNone && k <= n_layer_; ++k) {
        Pass &p = passes_[(layer + k) % n_layer_];  // k == n_layer_: the get's own layer
        while (s == ExpertCache::kNone && !p.pinned.empty()) {
            const int32_t t = p.pinned.back();
            p.pinned.pop_back();
            if (!slots_[t].prefetch_pin) continue;
            slots_[t].prefetch_pin = false;
            cache_.unpin(t);
            if (!cache_.pinned(t)) s = t;
        }
    }
    if (s == ExpertCache::kNone)
        throw Error(fmt::format(
            "{}: SSD streaming cache: all {} slots are in use by the last get of a layer; the "
            "consumer must call layer_done between layers, or the budget must grow",
            file_.path(), cache_.n_slots()));
    retire(s);
    return s;
}

// Empties a slot. An unpinned slot still being read (an announced expert whose pass ended first)
// is waited for: its reads write into the slot's memory until they complete.
void StreamingSource::retire(int32_t s) {
    Slot &slot = slots_[s];
    if (slot.state == State::Reading) {
        for (uint64_t t : slot.tickets) (void)reader_->wait(t);
    }
    if (slot.state != State::Empty && slot.fresh) ++stats_.prefetch_unused;
    slot = Slot{};
    cache_.clear(s);
}

void StreamingSource::start_load(int32_t s, uint32_t layer, uint32_t expert) {
    cache_.assign(s, layer, expert);
    Slot &slot = slots_[s];
    const uint64_t slabs[3] = {geom_.gate, geom_.up, geom_.down};
    uint8_t *region = slot_base(s);
    for (int i = 0; i < 3; ++i) {
        const uint64_t off = files_[layer].offset[i] + uint64_t(expert) * slabs[i];
        if (file_.direct()) {
            // O_DIRECT: an aligned superset into the aligned region; the slab starts `skew` in.
            const uint64_t a = align_down(off, kDirectAlign);
            const uint64_t len = align_up(off + slabs[i], kDirectAlign) - a;
            slot.skew[i] = off - a;
            slot.tickets[i] = reader_->submit(a, len, off + slabs[i] - a, region);
        } else {
            slot.skew[i] = 0;
            slot.tickets[i] = reader_->submit(off, slabs[i], region);
        }
        region += region_[i];
    }
    slot.state = State::Reading;
    slot.fresh = true;
    slot.prefetch_pin = false;
}

// Waits for the slot's three reads. On a failure the slot is emptied (never handed out) and
// ds4::Error names the file, layer, expert, tensor and range.
void StreamingSource::wait_ready(int32_t s) {
    Slot &slot = slots_[s];
    if (slot.state != State::Reading) return;
    const uint32_t layer = cache_.layer_of(s), expert = cache_.expert_of(s);
    const uint64_t slabs[3] = {geom_.gate, geom_.up, geom_.down};
    std::string error;
    for (int i = 0; i < 3; ++i) {
        const ReadResult r = reader_->wait(slot.tickets[i]);  // every read, even after a failure
        if (!error.empty()) continue;
        const uint64_t off = files_[layer].offset[i] + uint64_t(expert) * slabs[i];
        const uint64_t need = slot.skew[i] + slabs[i];
        if (r.error == 0 && r.bytes >= need) continue;
        // A file cut short shows as end of file, or under O_DIRECT as EINVAL from the unaligned
        // continuation of the last partial block: its size tells the two causes apart.
        const std::string where =
            fmt::format("{}: SSD streaming read of layer {} expert {} ({}, bytes [{}, {}))",
                        file_.path(), layer, expert, kSlabName[i], off, off + slabs[i]);
        struct stat st {};
        if (::fstat(file_.fd(), &st) == 0 && uint64_t(st.st_size) < off + slabs[i])
            error = fmt::format(
                "{} reached the end of the file at byte {}: the file was "
                "truncated after it was opened",
                where, uint64_t(st.st_size));
        else if (r.error != 0)
            error = fmt::format("{} failed: {}", where, std::strerror(r.error));
        else
            error = fmt::format("{} ended after {} of {} bytes", where, r.bytes, need);
    }
    // Bytes written into the file in place after it was opened: what was just read may be a
    // mix of the old and the new model, so nothing read is handed out.
    if (error.empty() && file_.changed())
        error = fmt::format(
            "{}: the model file changed (size or modification time) after it was opened: SSD "
            "streaming stops rather than mix two files' experts (layer {} expert {})",
            file_.path(), layer, expert);
    if (!error.empty()) {
        slot = Slot{};
        cache_.clear(s);
        throw Error(error);
    }
    slot.state = State::Ready;
}

void StreamingSource::release_held(uint32_t layer) {
    Pass &p = passes_[layer];
    if (p.held != ExpertCache::kNone) cache_.unpin(p.held);
    p.held = ExpertCache::kNone;
}

void StreamingSource::release_pass(uint32_t layer) {
    Pass &p = passes_[layer];
    for (int32_t s : p.pinned) {
        if (slots_[s].prefetch_pin) {
            slots_[s].prefetch_pin = false;
            cache_.unpin(s);
        }
    }
    p.pinned.clear();
    p.experts.clear();
    p.next = 0;
}

// Reads (or pins, when cached) the layer's announced experts in order while a slot is free,
// keeping one unpinned slot for a get of an expert that was not announced (so that the runtime's
// pattern never has to take an announced expert's slot back).
void StreamingSource::top_up(uint32_t layer) {
    Pass &p = passes_[layer];
    while (p.next < p.experts.size()) {
        const uint32_t e = p.experts[p.next];
        int32_t s = cache_.slot_of(layer, e);
        if (s == ExpertCache::kNone) {
            if (cache_.n_slots() - cache_.n_pinned() <= 1) return;
            s = cache_.victim();
            retire(s);
            start_load(s, layer, e);
        }
        if (!slots_[s].prefetch_pin && s != p.held) {
            slots_[s].prefetch_pin = true;
            cache_.pin(s);
            p.pinned.push_back(s);
        }
        ++p.next;
    }
}

ExpertBytes StreamingSource::bytes_of(int32_t s) const {
    const uint8_t *base = slot_base(s);
    const Slot &slot = slots_[s];
    return {base + slot.skew[0], base + region_[0] + slot.skew[1],
            base + region_[0] + region_[1] + slot.skew[2]};
}

}  // namespace ds4::experts

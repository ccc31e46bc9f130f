#include "runtime/cuda/device_expert_tier.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/host_upload.h"
#include "common/error.h"

namespace ds4::runtime::cuda_backend {
namespace {

constexpr uint64_t kPlaneAlign = 256;
constexpr uint32_t kDecayInterval = 16;  // as the host tier (experts/streaming_source.h)
constexpr double kGiB = 1024.0 * 1024 * 1024, kMiB = 1024.0 * 1024;

uint64_t align_up(uint64_t n) {
    return (n + kPlaneAlign - 1) / kPlaneAlign * kPlaneAlign;
}

uint64_t now_ns() {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}

std::array<model::Tensor, 3> routed(const model::LayerWeights &L) {
    return {L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps};
}

}  // namespace

DeviceExpertTier::Layout DeviceExpertTier::layout_of(const model::ModelWeights &w) {
    if (w.layers.empty()) throw Error("CUDA expert streaming: the model has no layers");
    Layout l;
    const auto first = routed(w.layers[0]);
    for (int i = 0; i < 3; ++i) {
        const model::Tensor t = first[i];
        if (!cuda::has_block_split(t->type))
            throw Error(fmt::format(
                "CUDA expert streaming takes routed experts in IQ2_XXS, Q2_K or Q4_K (the "
                "published files' formats); {} is {}: run it resident or on the CPU backend",
                t->name, ggml_type_name(t->type)));
        Part &p = l.parts[i];
        p.type = t->type;
        p.split = cuda::block_split(t->type);
        const int64_t k = int64_t(t->dim(0)), rows = int64_t(t->dim(1));
        p.n_blocks = rows * (k / 256);
        p.file_bytes = uint64_t(p.n_blocks) * uint64_t(p.split.block_bytes);
        if (k % 256 != 0 || p.file_bytes * t->dim(2) != t->n_bytes)
            throw Error(fmt::format("CUDA expert streaming: {} is not {} experts of whole blocks",
                                    t->name, t->dim(2)));
        p.plane_a = l.slot_bytes;
        l.slot_bytes += align_up(uint64_t(p.n_blocks) * uint64_t(p.split.seg_len));
        p.plane_b = l.slot_bytes;
        l.slot_bytes += align_up(uint64_t(p.n_blocks) * uint64_t(p.split.rest()));
        l.file_bytes += p.file_bytes;
    }
    for (const model::LayerWeights &L : w.layers) {
        const auto ts = routed(L);
        for (int i = 0; i < 3; ++i)
            if (ts[i]->type != first[i]->type || ts[i]->dim(0) != first[i]->dim(0) ||
                ts[i]->dim(1) != first[i]->dim(1) || ts[i]->dim(2) != first[i]->dim(2))
                throw Error(fmt::format(
                    "CUDA expert streaming: {} differs in type or shape from {} (one slot size "
                    "serves every layer)",
                    ts[i]->name, first[i]->name));
    }
    return l;
}

DeviceExpertTier::DeviceExpertTier(const model::HParams &hp, const model::ModelWeights &w,
                                   experts::ExpertSource &host, uint64_t n_slots)
    : hp_(hp),
      host_(host),
      layout_(layout_of(w)),
      cache_(hp.n_layer, hp.n_expert,
             uint32_t(std::min<uint64_t>(n_slots, uint64_t(hp.n_layer) * hp.n_expert))) {
    if (n_slots < hp.n_expert_used)
        throw Error(fmt::format(
            "CUDA expert streaming: {} device slots are below the floor of {} (one token's "
            "experts of one layer)",
            n_slots, hp.n_expert_used));
    const uint64_t n = cache_.n_slots();
    memory_ = cuda::DeviceBuffer(n * layout_.slot_bytes);
    staging_ = cuda::DeviceBuffer(layout_.file_bytes);
    layer_table_entries_ = size_t(3) * 2 * hp.n_expert;
    // Every entry starts at slot 0's planes: a kernel only reads the entries of the experts its
    // pass acquired, but a stale entry then still points at device memory.
    mirror_.resize(size_t(hp.n_layer) * layer_table_entries_);
    for (uint32_t il = 0; il < hp.n_layer; ++il)
        for (uint32_t e = 0; e < hp.n_expert; ++e) point(il, e, 0);
    tables_ = cuda::DeviceBuffer(mirror_.size() * sizeof(const uint8_t *));
    DS4_CUDA_CHECK(
        cudaMemcpy(tables_.get(), mirror_.data(), tables_.bytes(), cudaMemcpyHostToDevice));
    const size_t layer_bytes = layer_table_entries_ * sizeof(const uint8_t *);
    try {
        DS4_CUDA_CHECK(cudaMallocHost(&ring_, layer_bytes * kRing));
        for (cudaEvent_t &e : ring_done_)
            DS4_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        DS4_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
        for (cudaEvent_t *e : {&copied_, &uploaded_, &released_})
            DS4_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    } catch (...) {
        free_handles();  // no destructor runs for a constructor that throws
        throw;
    }

    const uint64_t n_total = uint64_t(hp.n_layer) * hp.n_expert;
    stats_.slots = n;
    stats_.slot_bytes = layout_.slot_bytes;
    log_.push_back(fmt::format(
        "CUDA device tier: {} slots x {:.2f} MiB = {:.2f} GiB of device memory ({:.1f}% of the "
        "{} routed experts{})",
        n, double(layout_.slot_bytes) / kMiB, double(n * layout_.slot_bytes) / kGiB,
        100.0 * double(n) / double(n_total), n_total, n == n_total ? ": every expert fits" : ""));

    const std::span<uint8_t> mem = host_.owned_memory();
    if (!mem.empty()) {
        const uint64_t t0 = now_ns();
        cudaError_t e = cudaHostRegister(mem.data(), mem.size(), cudaHostRegisterDefault);
        std::string how, why;
        if (e != cudaSuccess) {
            why = cudaGetErrorString(e);
            (void)cudaGetLastError();  // not sticky; clear it
            // Memory nobody writes (the mapped file, whose mapping is read-only) is registered
            // read-only where the device supports it: the device only reads the host tier. Not a
            // cache the host writes after the pin: a read-only pin may keep the pages it found.
            int read_only = 0;
            int device = 0;
            if (host_.bytes_stay_valid() && cudaGetDevice(&device) == cudaSuccess &&
                cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported,
                                       device) == cudaSuccess &&
                read_only != 0) {
                e = cudaHostRegister(mem.data(), mem.size(), cudaHostRegisterReadOnly);
                how = " (read-only)";
                if (e != cudaSuccess) {
                    why += fmt::format("; read-only: {}", cudaGetErrorString(e));
                    (void)cudaGetLastError();
                }
            }
        }
        if (e == cudaSuccess) {
            registered_ = mem.data();
            log_.push_back(
                fmt::format("CUDA device tier: the host tier's {:.2f} GiB pinned{} in {:.1f} s",
                            double(mem.size()) / kGiB, how, double(now_ns() - t0) / 1e9));
        } else {
            log_.push_back(fmt::format(
                "CUDA device tier: notice: pinning the host tier's {:.2f} GiB failed ({}); "
                "transfers go through the driver's staging (slower)",
                double(mem.size()) / kGiB, why));
        }
    }
}

DeviceExpertTier::~DeviceExpertTier() {
    // Nothing may still read the host tier or the slots when they go.
    if (copy_) cudaStreamSynchronize(copy_);
    cudaDeviceSynchronize();
    if (registered_) cudaHostUnregister(registered_);
    free_handles();
}

void DeviceExpertTier::free_handles() noexcept {
    for (cudaEvent_t &e : ring_done_)
        if (e) cudaEventDestroy(std::exchange(e, nullptr));
    for (cudaEvent_t *e : {&copied_, &uploaded_, &released_})
        if (*e) cudaEventDestroy(std::exchange(*e, nullptr));
    if (copy_) cudaStreamDestroy(std::exchange(copy_, nullptr));
    if (ring_) cudaFreeHost(std::exchange(ring_, nullptr));
}

cuda::ExpertTable DeviceExpertTier::table(uint32_t il, int part) const {
    const auto *base = tables_.as<const uint8_t *>() + size_t(il) * layer_table_entries_ +
                       size_t(part) * 2 * hp_.n_expert;
    return {base, base + hp_.n_expert};
}

void DeviceExpertTier::point(uint32_t il, uint32_t e, int32_t slot) {
    const uint8_t *base = slot_base(slot);
    for (int i = 0; i < 3; ++i) {
        const size_t at = size_t(il) * layer_table_entries_ + size_t(i) * 2 * hp_.n_expert + e;
        mirror_[at] = base + layout_.parts[i].plane_a;
        mirror_[at + hp_.n_expert] = base + layout_.parts[i].plane_b;
    }
}

void DeviceExpertTier::wait_copied() {
    if (!copy_pending_) return;
    const uint64_t t0 = now_ns();
    DS4_CUDA_CHECK(cudaEventSynchronize(copied_));
    stats_.upload_wait_ns += now_ns() - t0;
    copy_pending_ = false;
}

void DeviceExpertTier::wait_host_bytes() {
    if (!host_.bytes_stay_valid()) wait_copied();
}

void DeviceExpertTier::upload(uint32_t il, uint32_t e, int32_t slot) {
    wait_host_bytes();  // the previous miss's host bytes end at this get
    const experts::ExpertBytes b = host_.get(il, e);
    const uint8_t *src[3] = {b.gate, b.up, b.down};
    uint8_t *staging = staging_.as<uint8_t>();
    uint64_t off = 0;
    for (int i = 0; i < 3; ++i) {
        DS4_CUDA_CHECK(cudaMemcpyAsync(staging + off, src[i], layout_.parts[i].file_bytes,
                                       cudaMemcpyHostToDevice, copy_));
        off += layout_.parts[i].file_bytes;
    }
    DS4_CUDA_CHECK(cudaEventRecord(copied_, copy_));
    copy_pending_ = true;
    // The transfer into the staging touched no slot; the repack into one waits for the kernels
    // of the last pass.
    if (copy_waits_release_) {
        DS4_CUDA_CHECK(cudaStreamWaitEvent(copy_, released_, 0));
        copy_waits_release_ = false;
    }
    // The repack into the slot's planes reads the staging; the next miss's transfer into it
    // comes after on the same stream.
    off = 0;
    for (int i = 0; i < 3; ++i) {
        const Part &p = layout_.parts[i];
        cuda::split_blocks_async(staging + off, p.n_blocks, p.split.block_bytes, p.split.seg_off,
                                 p.split.seg_len, slot_base(slot) + p.plane_a,
                                 slot_base(slot) + p.plane_b, copy_);
        off += p.file_bytes;
    }
}

void DeviceExpertTier::push_tables(uint32_t il, cudaStream_t s) {
    const size_t bytes = layer_table_entries_ * sizeof(const uint8_t *);
    const int r = ring_next_;
    ring_next_ = (ring_next_ + 1) % kRing;
    DS4_CUDA_CHECK(cudaEventSynchronize(ring_done_[r]));  // its last transfer is done
    uint8_t *host = ring_ + size_t(r) * bytes;
    std::memcpy(host, mirror_.data() + size_t(il) * layer_table_entries_, bytes);
    DS4_CUDA_CHECK(
        cudaMemcpyAsync(tables_.as<const uint8_t *>() + size_t(il) * layer_table_entries_, host,
                        bytes, cudaMemcpyHostToDevice, s));
    DS4_CUDA_CHECK(cudaEventRecord(ring_done_[r], s));
}

void DeviceExpertTier::unpin_pass() {
    for (int32_t slot : pass_slots_) cache_.unpin(slot);
    pass_slots_.clear();
    pass_open_ = false;
}

void DeviceExpertTier::acquire(uint32_t il, std::span<const uint32_t> experts, cudaStream_t s,
                               std::vector<uint8_t> *hit) {
    if (pass_open_) throw Error("CUDA device tier: acquire before the last pass's release");
    if (il >= hp_.n_layer) throw Error(fmt::format("CUDA device tier: no layer {}", il));
    if (experts.size() > cache_.n_slots())
        throw Error(fmt::format("CUDA device tier: a pass of {} experts in {} slots",
                                experts.size(), cache_.n_slots()));
    for (size_t i = 0; i < experts.size(); ++i)
        if (experts[i] >= hp_.n_expert || (i > 0 && experts[i] <= experts[i - 1]))
            throw Error("CUDA device tier: a pass's experts must be distinct, increasing ids");
    pass_open_ = true;
    if (hit) hit->assign(experts.size(), 0);
    std::vector<uint32_t> misses;
    int32_t filling = experts::ExpertCache::kNone;
    uint64_t hits = 0;
    try {
        // The pass's work on s comes after the last pass's kernels, whatever stream they ran on.
        if (released_once_) DS4_CUDA_CHECK(cudaStreamWaitEvent(s, released_, 0));
        for (size_t i = 0; i < experts.size(); ++i) {
            const uint32_t e = experts[i];
            cache_.select(il, e);
            const int32_t slot = cache_.slot_of(il, e);
            if (slot == experts::ExpertCache::kNone) {
                misses.push_back(e);
                continue;
            }
            if (hit) (*hit)[i] = 1;
            cache_.pin(slot);
            cache_.touch(slot, ++tick_);
            pass_slots_.push_back(slot);
            point(il, e, slot);
            ++hits;
        }
        if (!misses.empty()) {
            host_.prefetch(il, misses);
            // Slots are rewritten only after the kernels of the last pass are done (upload
            // makes the copy stream wait for that before its first repack).
            copy_waits_release_ = released_once_;
            for (uint32_t e : misses) {
                const int32_t slot = cache_.victim();
                if (slot == experts::ExpertCache::kNone)
                    throw Error("CUDA device tier: no slot to reuse");  // n <= n_slots
                cache_.assign(slot, il, e);
                cache_.pin(slot);
                cache_.touch(slot, ++tick_);
                pass_slots_.push_back(slot);
                filling = slot;
                upload(il, e, slot);
                filling = experts::ExpertCache::kNone;
                point(il, e, slot);
            }
            wait_host_bytes();
            host_.layer_done(il);
            DS4_CUDA_CHECK(cudaEventRecord(uploaded_, copy_));
            uploads_unwaited_ = true;
            if (!hit) wait_uploads(s);
        }
        // The tables may go up before the uploads end: a kernel reads a missed expert's slot
        // only after wait_uploads.
        push_tables(il, s);
    } catch (...) {
        // Nothing half-filled stays named, nothing stays pinned, no transfer still reads the
        // host tier's bytes, and the pass is closed.
        if (filling != experts::ExpertCache::kNone) cache_.clear(filling);
        cudaStreamSynchronize(copy_);
        copy_pending_ = false;
        copy_waits_release_ = false;
        uploads_unwaited_ = false;
        if (!misses.empty()) host_.layer_done(il);
        unpin_pass();
        throw;
    }
    ++stats_.passes;
    if (hit && hits > 0 && !misses.empty()) ++stats_.hits_first;
    stats_.acquires += experts.size();
    stats_.hits += hits;
    stats_.misses += misses.size();
    stats_.bytes_uploaded += misses.size() * layout_.file_bytes;
}

void DeviceExpertTier::wait_uploads(cudaStream_t s) {
    if (!uploads_unwaited_) return;
    DS4_CUDA_CHECK(cudaStreamWaitEvent(s, uploaded_, 0));
    uploads_unwaited_ = false;
}

void DeviceExpertTier::release(cudaStream_t s) {
    if (!pass_open_) return;
    // The event below covers the pass's uploads too (a hits-first pass whose misses' kernels
    // were never enqueued).
    cudaError_t e = cudaSuccess;
    if (uploads_unwaited_) e = cudaStreamWaitEvent(s, uploaded_, 0);
    uploads_unwaited_ = false;
    if (e == cudaSuccess) e = cudaEventRecord(released_, s);
    if (e == cudaSuccess) {
        released_once_ = true;
    } else {
        // released_ still marks an older pass: nothing may read this pass's slots once they are
        // unpinned, so wait for everything before giving them up.
        (void)cudaGetLastError();
        cudaDeviceSynchronize();
    }
    unpin_pass();
    DS4_CUDA_CHECK(e);
}

uint64_t DeviceExpertTier::preload(std::span<const experts::ExpertKey> keys) {
    if (pass_open_ || stats_.passes != 0)
        throw Error("CUDA device tier: preload after the first pass");
    int32_t filling = experts::ExpertCache::kNone;
    uint32_t layer = 0;
    uint64_t n = 0;
    // The most wanted expert gets the latest use, so that the first evictions take the least
    // wanted (as the host tier's preload).
    const uint64_t base = tick_;
    try {
        for (size_t i = 0; i < keys.size(); ++i) {
            const experts::ExpertKey &k = keys[i];
            if (k.layer >= hp_.n_layer || k.expert >= hp_.n_expert)
                throw Error(fmt::format("CUDA device tier: no expert ({}, {}) to preload", k.layer,
                                        k.expert));
            if (cache_.slot_of(k.layer, k.expert) != experts::ExpertCache::kNone) continue;
            const int32_t slot = cache_.victim();  // an empty slot first
            if (slot == experts::ExpertCache::kNone || !cache_.empty(slot)) break;
            cache_.assign(slot, k.layer, k.expert);
            cache_.touch(slot, base + keys.size() - i);
            filling = slot;
            layer = k.layer;
            upload(k.layer, k.expert, slot);
            // The host tier's slot is given back at once: its bytes are on the device.
            wait_host_bytes();
            host_.layer_done(k.layer);
            filling = experts::ExpertCache::kNone;
            point(k.layer, k.expert, slot);
            ++n;
        }
    } catch (...) {
        if (filling != experts::ExpertCache::kNone) {
            cache_.clear(filling);
            cudaStreamSynchronize(copy_);
            copy_pending_ = false;
            host_.layer_done(layer);
        }
        throw;
    }
    tick_ = base + keys.size() + 1;
    // The first pass's kernels find the slots filled: its stream does not wait for the copy
    // stream when every expert hits.
    DS4_CUDA_CHECK(cudaStreamSynchronize(copy_));
    stats_.preloaded += n;
    return n;
}

void DeviceExpertTier::step_done() {
    host_.step_done();
    if (++steps_ % kDecayInterval == 0) cache_.decay();
}

DeviceTierStats DeviceExpertTier::stats() const {
    return stats_;
}

}  // namespace ds4::runtime::cuda_backend

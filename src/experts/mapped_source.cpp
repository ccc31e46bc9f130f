#include "experts/mapped_source.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "experts/streaming_source.h"
#include "gguf/gguf_file.h"
#include "model/weights.h"

namespace ds4::experts {

MappedHostSource::MappedHostSource(const gguf::File &file, const model::ModelWeights &weights)
    : resident_(make_resident_source(weights)), engine_base_(file.base()), size_(file.file_size()) {
    if (weights.layers.empty()) throw Error("mapped host tier: the model has no layers");
    const model::LayerWeights &first = weights.layers[0];
    n_expert_ = uint32_t(first.ffn_gate_exps->ne[2]);
    if (n_expert_ == 0) throw Error("mapped host tier: the model has no routed experts");
    counts_.assign(weights.layers.size() * size_t(n_expert_), 0);
    const uint64_t payload = expert_geometry(weights).payload();  // throws for unequal experts
    uint64_t lo = size_, hi = 0;
    for (const model::LayerWeights &L : weights.layers)
        for (const model::Tensor t : {L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps}) {
            const uint64_t off = uint64_t(t->data - engine_base_);
            lo = std::min(lo, off);
            hi = std::max(hi, off + t->n_bytes);
        }

    // Last, so that nothing can throw once the mapping exists (the destructor unmaps it).
    const int fd = ::open(file.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        throw Error(
            fmt::format("mapped host tier: cannot open {}: {}", file.path(), std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        throw Error(
            fmt::format("mapped host tier: cannot stat {}: {}", file.path(), std::strerror(e)));
    }
    if (uint64_t(st.st_size) != size_) {
        ::close(fd);
        throw Error(fmt::format(
            "mapped host tier: {} is no longer the size it was opened at ({} bytes, now {})",
            file.path(), size_, uint64_t(st.st_size)));
    }
    void *map = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    const int map_errno = errno;
    ::close(fd);  // the mapping keeps the file
    if (map == MAP_FAILED)
        throw Error(fmt::format("mapped host tier: cannot map {}: {}", file.path(),
                                std::strerror(map_errno)));
    base_ = static_cast<uint8_t *>(map);
    // Whole pages (a registration pins pages); the mapping itself covers whole pages.
    const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
    lo = lo / page * page;
    hi = (hi + page - 1) / page * page;
    routed_ = {base_ + lo, size_t(hi - lo)};

    stats_.streaming = true;
    stats_.reader = "the file's mapping";
    stats_.entries = counts_.size();
    stats_.expert_bytes = payload;
    stats_.slot_bytes = stats_.expert_bytes;
}

MappedHostSource::~MappedHostSource() {
    if (base_) ::munmap(base_, size_);
}

ExpertBytes MappedHostSource::get(uint32_t layer, uint32_t expert) {
    if (layer >= counts_.size() / n_expert_)
        throw Error(fmt::format("mapped host tier: no layer {}", layer));
    const ExpertBytes b = resident_->get(layer, expert);  // checks the expert
    ++counts_[size_t(layer) * n_expert_ + expert];
    ++stats_.gets;
    ++stats_.hits;
    // The same bytes at the same offsets of this source's mapping.
    auto here = [&](const uint8_t *p) { return base_ + (p - engine_base_); };
    return {here(b.gate), here(b.up), here(b.down)};
}

ExpertStats MappedHostSource::stats() const {
    return stats_;
}

}  // namespace ds4::experts

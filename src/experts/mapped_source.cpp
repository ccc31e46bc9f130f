#include "experts/mapped_source.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "common/error.h"
#include "model/weights.h"

namespace ds4::experts {

MappedHostSource::MappedHostSource(const model::ModelWeights &weights,
                                   std::span<const uint8_t> mapping)
    : resident_(make_resident_source(weights)) {
    if (weights.layers.empty()) throw Error("mapped host tier: the model has no layers");
    const model::LayerWeights &first = weights.layers[0];
    n_expert_ = uint32_t(first.ffn_gate_exps->ne[2]);
    counts_.assign(weights.layers.size() * size_t(n_expert_), 0);
    const uint8_t *lo = mapping.data() + mapping.size(), *hi = mapping.data();
    for (const model::LayerWeights &L : weights.layers)
        for (const model::Tensor t : {L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps}) {
            if (t->data < mapping.data() || t->n_bytes > mapping.size() ||
                t->data - mapping.data() > ptrdiff_t(mapping.size() - t->n_bytes))
                throw Error(
                    fmt::format("mapped host tier: {} is not in the file's mapping", t->name));
            lo = std::min(lo, t->data);
            hi = std::max(hi, t->data + t->n_bytes);
        }
    // Whole pages (a registration pins pages); the mapping itself covers whole pages.
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t a = uintptr_t(lo) / page * page, b = (uintptr_t(hi) + page - 1) / page * page;
    routed_ = {reinterpret_cast<uint8_t *>(a), size_t(b - a)};

    stats_.streaming = true;
    stats_.reader = "the file's mapping";
    stats_.entries = counts_.size();
    stats_.expert_bytes =
        (first.ffn_gate_exps->n_bytes + first.ffn_up_exps->n_bytes + first.ffn_down_exps->n_bytes) /
        n_expert_;
    stats_.slot_bytes = stats_.expert_bytes;
}

ExpertBytes MappedHostSource::get(uint32_t layer, uint32_t expert) {
    if (layer >= counts_.size() / n_expert_)
        throw Error(fmt::format("mapped host tier: no layer {}", layer));
    const ExpertBytes b = resident_->get(layer, expert);  // checks the expert
    ++counts_[size_t(layer) * n_expert_ + expert];
    ++stats_.gets;
    ++stats_.hits;
    return b;
}

ExpertStats MappedHostSource::stats() const {
    return stats_;
}

}  // namespace ds4::experts

#include "runtime/layer_stages.h"

#include <fmt/format.h>

#include <sstream>

#include "common/error.h"
#include "runtime/kv_cache_io.h"

namespace ds4::runtime {

size_t StagedState::payload_bytes() const {
    size_t b = 0;
    for (const auto &p : parts) b += p->payload_bytes();
    return b;
}

std::vector<LayerRange> split_layers(uint32_t n_layer, std::span<const uint32_t> starts) {
    std::vector<LayerRange> ranges;
    uint32_t begin = 0;
    for (uint32_t s : starts) {
        if (s <= begin || s >= n_layer)
            throw Error(fmt::format(
                "layer split at {}: each split must be above the previous ({}) and below the "
                "layer count ({})",
                s, begin, n_layer));
        ranges.push_back({begin, s});
        begin = s;
    }
    ranges.push_back({begin, n_layer});
    return ranges;
}

LayerStages::LayerStages(const model::HParams &hp, std::vector<Stage> stages, bool f16_rows,
                         bool parts)
    : hp_(hp), stages_(std::move(stages)), f16_rows_(f16_rows), parts_(parts) {
    if (stages_.empty()) throw Error("internal: a session with no backend");
    uint32_t next = 0;
    for (const Stage &s : stages_) {
        if (parts_) next = 0;  // each part runs every layer
        if (!s.ops || s.layers.begin != next || s.layers.end <= s.layers.begin ||
            (parts_ && s.layers.end != hp.n_layer))
            throw Error(fmt::format("internal: stage of layers [{}, {}) after layer {}",
                                    s.layers.begin, s.layers.end, next));
        if (s.ops->ctx() != ctx() || s.ops->n_past() != n_past())
            throw Error("internal: the stages of a session hold different contexts");
        next = s.layers.end;
    }
    if (next != hp.n_layer)
        throw Error(fmt::format("internal: stages cover {} of {} layers", next, hp.n_layer));
}

std::shared_ptr<const BackendState> LayerStages::save() const {
    auto st = std::make_shared<StagedState>();
    for (const Stage &s : stages_) st->parts.push_back(s.ops->save());
    return st;
}

std::shared_ptr<const BackendState> LayerStages::save_tail() const {
    auto st = std::make_shared<StagedState>();
    for (const Stage &s : stages_) st->parts.push_back(s.ops->save_tail());
    return st;
}

namespace {
const StagedState &staged(const BackendState &state, size_t n_stages, const char *what) {
    const auto *st = dynamic_cast<const StagedState *>(&state);
    if (st == nullptr || st->parts.size() != n_stages)
        throw Error(fmt::format("{}: a state of a session split otherwise", what));
    return *st;
}
}  // namespace

void LayerStages::restore(const BackendState &state) {
    const StagedState &st = staged(state, stages_.size(), "restore");
    for (size_t i = 0; i < stages_.size(); ++i) stages_[i].ops->restore(*st.parts[i]);
}

void LayerStages::rewind(const BackendState &tail) {
    const StagedState &st = staged(tail, stages_.size(), "rewind");
    for (size_t i = 0; i < stages_.size(); ++i) stages_[i].ops->rewind(*st.parts[i]);
}

size_t LayerStages::kv_bytes() const {
    size_t b = 0;
    for (const Stage &s : stages_) b += s.ops->kv_bytes();
    return b;
}

void LayerStages::write_state(std::ostream &out) const {
    // The parts of a tensor split hold the same state: the first one's is the model's.
    if (stages_.size() == 1 || parts_) return stages_[0].ops->write_state(out);
    // Each stage's state holds its own layers (the others empty): the layers are gathered into
    // one state of every layer.
    KvCache all;
    all.ctx = ctx();
    all.f16_rows = f16_rows_;
    all.n_past = n_past();
    all.layers.resize(hp_.n_layer);
    for (const Stage &s : stages_) {
        std::stringstream part;
        s.ops->write_state(part);
        KvCache c = read_kv_cache(part, hp_, ctx(), f16_rows_, n_past(), s.layers);
        for (uint32_t il = s.layers.begin; il < s.layers.end; ++il)
            all.layers[il] = std::move(c.layers[il]);
    }
    write_kv_cache(out, all);
}

void LayerStages::read_state(std::istream &in, int64_t n_past) {
    if (stages_.size() == 1) return stages_[0].ops->read_state(in, n_past);
    // Everything is read and checked first; each stage then reads its layers (every part of a
    // tensor split all of them).
    KvCache all = read_kv_cache(in, hp_, ctx(), f16_rows_, n_past);
    if (parts_) {
        std::stringstream bytes;
        write_kv_cache(bytes, all);
        const std::string state = bytes.str();
        for (const Stage &s : stages_) {
            std::istringstream copy(state);
            s.ops->read_state(copy, n_past);
        }
        return;
    }
    for (const Stage &s : stages_) {
        KvCache part;
        part.ctx = all.ctx;
        part.f16_rows = f16_rows_;
        part.n_past = all.n_past;
        part.layers.resize(hp_.n_layer);
        for (uint32_t il = s.layers.begin; il < s.layers.end; ++il)
            part.layers[il] = std::move(all.layers[il]);
        std::stringstream bytes;
        write_kv_cache(bytes, part);
        s.ops->read_state(bytes, n_past);
    }
}

}  // namespace ds4::runtime

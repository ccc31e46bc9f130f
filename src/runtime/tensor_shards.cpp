#include "runtime/tensor_shards.h"

#include <fmt/format.h>

#include <cstring>
#include <unordered_map>

#include "common/error.h"
#include "model/tensor_layout.h"

namespace ds4::runtime {
namespace {

// Rows [b, e) (ne[1]) or columns [b, e) (ne[0], whole blocks) of every plane of t, as a tensor
// of its own whose bytes `out` receives.
std::unique_ptr<gguf::TensorInfo> part_of(const gguf::TensorInfo &t, ShardAxis axis, uint64_t b,
                                          uint64_t e, std::unique_ptr<uint8_t[]> &out) {
    auto p = std::make_unique<gguf::TensorInfo>(t);
    const uint64_t planes = t.planes(), rows = t.dim(1), row = t.row_bytes();
    if (axis == ShardAxis::Rows) {
        p->ne[1] = e - b;
        const uint64_t part = (e - b) * row;
        p->n_bytes = part * planes;
        out = std::make_unique<uint8_t[]>(p->n_bytes);
        for (uint64_t q = 0; q < planes; ++q)
            std::memcpy(out.get() + q * part, t.data + q * rows * row + b * row, part);
    } else {
        p->ne[0] = e - b;
        const uint64_t skip = ggml_row_bytes(t.type, b), part = ggml_row_bytes(t.type, e - b);
        p->n_bytes = part * rows * planes;
        out = std::make_unique<uint8_t[]>(p->n_bytes);
        for (uint64_t r = 0; r < rows * planes; ++r)
            std::memcpy(out.get() + r * part, t.data + r * row + skip, part);
    }
    p->n_elements = 1;
    for (uint64_t n : p->ne) p->n_elements *= n;
    p->data = out.get();
    return p;
}

}  // namespace

TensorShard::TensorShard(const model::HParams &hp, const model::ModelWeights &w,
                         const GpuPlacement &plan, uint32_t rank)
    : hp_(hp), w_(w) {
    if (plan.split != GpuSplit::Tensors) throw Error("tensor shards: a plan of the layer split");
    if (rank >= plan.gpus.size())
        throw Error(
            fmt::format("tensor shards: rank {} of a plan for {} GPUs", rank, plan.gpus.size()));
    std::unordered_map<std::string, const TensorPlacement *> by_name;
    for (const TensorPlacement &tp : plan.tensors) by_name[tp.name] = &tp;

    uint64_t ff = 0;  // the expert hidden columns of this rank (every layer the same)
    // The model's hyper-parameters give the layout (hp_ changes as the parts are found).
    model::for_each_tensor(hp, &w_, [&](const model::TensorSpec &s, const gguf::TensorInfo **slot) {
        if (slot == nullptr || *slot == nullptr) return;
        const gguf::TensorInfo &t = **slot;
        const auto it = by_name.find(t.name);
        if (it == by_name.end())
            throw Error(fmt::format("tensor shards: {} is not in the plan", t.name));
        const TensorPlacement &tp = *it->second;
        if (tp.axis == ShardAxis::Whole) {
            whole_bytes_ += t.n_bytes;
            return;
        }
        const auto [b, e] = tp.ranges.at(rank);
        if (e <= b)
            throw Error(fmt::format(
                "tensor split over {} GPUs: GPU {} gets none of {} ({} {} in units the split "
                "keeps whole); use fewer GPUs",
                plan.gpus.size(), rank, t.name, tp.extent,
                tp.axis == ShardAxis::Rows ? "rows" : "columns"));
        std::unique_ptr<uint8_t[]> bytes;
        parts_.push_back(part_of(t, tp.axis, b, e, bytes));
        shard_bytes_ += parts_.back()->n_bytes;
        bytes_.push_back(std::move(bytes));
        *slot = parts_.back().get();
        const std::string &n = t.name;
        if (s.layer < 0) {  // output.weight: vocabulary rows
            vocab_begin_ = b;
            vocab_end_ = e;
        } else if (n.ends_with("attn_q_b.weight")) {
            hp_.n_head = uint32_t((e - b) / hp.head_dim);
        } else if (n.ends_with("attn_output_a.weight")) {
            hp_.n_out_group = uint32_t((e - b) / hp.o_lora_rank);
        } else if (n.ends_with("ffn_gate_exps.weight")) {
            if (ff != 0 && ff != e - b)
                throw Error(fmt::format(
                    "tensor shards: {} gives GPU {} {} expert hidden columns, an earlier layer "
                    "{}: the split needs the same in every layer",
                    n, rank, e - b, ff));
            ff = e - b;
        }
    });
    if (ff == 0) throw Error("tensor shards: no routed expert tensors");
    hp_.n_ff_exp = uint32_t(ff);
    // The shared expert's hidden columns must be its experts' share of the same width.
    for (const model::LayerWeights &L : w_.layers)
        if (L.ffn_gate_shexp->ne[1] != uint64_t(hp_.n_ff_exp) * hp.n_expert_shared)
            throw Error(fmt::format(
                "tensor shards: GPU {} gets {} shared-expert hidden columns and {} routed ones "
                "({} shared experts): the split needs them equal",
                rank, L.ffn_gate_shexp->ne[1], hp_.n_ff_exp, hp.n_expert_shared));
}

void TensorShard::release_bytes() {
    for (auto &p : parts_) p->data = nullptr;
    bytes_.clear();
}

}  // namespace ds4::runtime

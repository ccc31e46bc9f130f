#include "runtime/gpu_placement.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "common/error.h"
#include "gguf/ggml_type.h"
#include "model/tensor_layout.h"
#include "runtime/kv_cache.h"

namespace ds4::runtime {
namespace {

double gib(uint64_t bytes) {
    return double(bytes) / double(1ull << 30);
}

// The tensor's name after "blk.N.", or the whole name of a global tensor.
std::string suffix_of(const model::TensorSpec &s) {
    if (s.layer < 0) return s.name;
    return s.name.substr(s.name.find('.', 4) + 1);
}

// Bytes of rows [begin, end) (ne[1]) or columns [begin, end) (ne[0]) of t, every plane.
uint64_t part_bytes(const gguf::TensorInfo &t, ShardAxis axis, uint64_t begin, uint64_t end) {
    if (end <= begin) return 0;
    switch (axis) {
        case ShardAxis::Whole:
            return t.n_bytes;
        case ShardAxis::Rows:
            return (end - begin) * t.row_bytes() * t.planes();
        case ShardAxis::Columns:
            return t.dim(1) * t.planes() * ggml_row_bytes(t.type, end - begin);
    }
    return 0;
}

// How the Tensors split cuts one tensor: along which axis, in units of how many rows or columns.
struct Cut {
    ShardAxis axis = ShardAxis::Whole;
    uint64_t unit = 1;
};

// The unit of the expert hidden width: a block of every down projection's format, routed and
// shared, in every layer (their least common multiple), so that every layer's routed and shared
// experts are cut at the same columns and no block of any of them is cut.
uint64_t expert_unit(const model::ModelWeights &w) {
    uint64_t unit = 1;
    for (const model::LayerWeights &L : w.layers)
        for (model::Tensor down : {L.ffn_down_exps, L.ffn_down_shexp})
            if (down) unit = std::lcm(unit, uint64_t{ggml_type_info(down->type).block_elems});
    return unit;
}

Cut tensor_cut(const model::HParams &hp, const model::ModelWeights &w, const model::TensorSpec &s) {
    const std::string x = suffix_of(s);
    const uint64_t heads_per_group = hp.n_head / hp.n_out_group;
    if (s.layer < 0) {
        if (x == "output.weight") return {ShardAxis::Rows, 1};  // vocabulary rows
        return {};
    }
    if (x == "attn_q_b.weight") return {ShardAxis::Rows, heads_per_group * hp.head_dim};
    if (x == "attn_sinks.weight") return {ShardAxis::Columns, heads_per_group};
    if (x == "attn_output_a.weight") return {ShardAxis::Rows, hp.o_lora_rank};
    if (x == "attn_output_b.weight") return {ShardAxis::Columns, hp.o_lora_rank};
    if (x == "ffn_gate_exps.weight" || x == "ffn_up_exps.weight" || x == "ffn_gate_shexp.weight" ||
        x == "ffn_up_shexp.weight")
        return {ShardAxis::Rows, expert_unit(w)};
    if (x == "ffn_down_exps.weight" || x == "ffn_down_shexp.weight")
        return {ShardAxis::Columns, expert_unit(w)};
    return {};
}

// Every bound tensor with its spec, in file order.
template <class Fn>
void for_each_bound(const model::HParams &hp, const model::ModelWeights &w, Fn fn) {
    // for_each_tensor writes through slots only when given weights; here it is only read.
    auto &mutable_w = const_cast<model::ModelWeights &>(w);
    model::for_each_tensor(hp, &mutable_w,
                           [&](const model::TensorSpec &s, const gguf::TensorInfo **slot) {
                               if (slot != nullptr && *slot != nullptr) fn(s, **slot);
                           });
}

// The contiguous split of layer costs into n ranges, with `first` added to the first range and
// `last` to the last, whose largest range total is smallest (the earliest such split). Returns
// the ranges' starts, then n_layer.
std::vector<uint32_t> balanced_ranges(const std::vector<uint64_t> &cost, uint32_t n, uint64_t first,
                                      uint64_t last) {
    const size_t L = cost.size();
    std::vector<uint64_t> prefix(L + 1, 0);
    for (size_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + cost[i];
    const uint64_t kInf = std::numeric_limits<uint64_t>::max();
    // best[g][i]: the smallest largest total of layers [0, i) in g + 1 ranges; from[g][i]: the
    // start of the last of them.
    std::vector<std::vector<uint64_t>> best(n, std::vector<uint64_t>(L + 1, kInf));
    std::vector<std::vector<size_t>> from(n, std::vector<size_t>(L + 1, 0));
    for (size_t i = 1; i <= L; ++i) best[0][i] = first + prefix[i] + (n == 1 ? last : 0);
    for (uint32_t g = 1; g < n; ++g)
        for (size_t i = g + 1; i <= L; ++i)
            for (size_t j = g; j < i; ++j) {
                if (best[g - 1][j] == kInf) continue;
                const uint64_t range = prefix[i] - prefix[j] + (g + 1 == n ? last : 0);
                const uint64_t worst = std::max(best[g - 1][j], range);
                if (worst < best[g][i]) best[g][i] = worst, from[g][i] = j;
            }
    std::vector<uint32_t> starts(n + 1);
    starts[n] = static_cast<uint32_t>(L);
    size_t end = L;
    for (uint32_t g = n - 1; g > 0; --g) {
        end = from[g][end];
        starts[g] = static_cast<uint32_t>(end);
    }
    starts[0] = 0;
    return starts;
}

bool is_output_side(const std::string &name) {
    return name == "output.weight" || name == "output_norm.weight" ||
           name.rfind("output_hc_", 0) == 0;
}

// A tensor's placement with no GPU holding any of it yet.
TensorPlacement unplaced(const model::TensorSpec &s, const gguf::TensorInfo &t, uint32_t n_gpus) {
    TensorPlacement tp;
    tp.name = s.name;
    tp.layer = s.layer;
    tp.bytes = t.n_bytes;
    tp.ranges.assign(n_gpus, {});
    tp.gpu_bytes.assign(n_gpus, 0);
    return tp;
}

}  // namespace

const char *gpu_split_name(GpuSplit s) {
    return s == GpuSplit::Layers ? "layers" : "tensors";
}

GpuSplit parse_gpu_split(const std::string &name) {
    if (name == "layers") return GpuSplit::Layers;
    if (name == "tensors") return GpuSplit::Tensors;
    throw Error("GPU split '" + name + "': expected layers or tensors");
}

GpuPlacement plan_gpu_placement(const model::HParams &hp, const model::ModelWeights &w,
                                GpuSplit split, uint32_t n_gpus, uint32_t ctx, uint32_t max_batch) {
    if (n_gpus == 0) throw Error("GPU placement: at least one GPU is needed");
    if (split == GpuSplit::Layers && n_gpus > hp.n_layer)
        throw Error(
            fmt::format("GPU placement: {} GPUs for {} layers; the layer split gives every "
                        "GPU at least one layer",
                        n_gpus, hp.n_layer));
    GpuPlacement p;
    p.split = split;
    p.ctx = ctx;
    p.gpus.resize(n_gpus);

    std::vector<uint64_t> state(hp.n_layer);
    const uint64_t ring = uint64_t(hp.sliding_window) + (max_batch > 1 ? max_batch : 0);
    for (uint32_t il = 0; il < hp.n_layer; ++il)
        state[il] = layer_state_bytes(hp, il, ring, ctx, sizeof(float));

    if (split == GpuSplit::Layers) {
        std::vector<uint64_t> cost = state;
        uint64_t first = 0, last = 0;
        for_each_bound(hp, w, [&](const model::TensorSpec &s, const gguf::TensorInfo &t) {
            if (s.layer >= 0)
                cost[static_cast<size_t>(s.layer)] += t.n_bytes;
            else if (is_output_side(s.name))
                last += t.n_bytes;
            else
                first += t.n_bytes;
        });
        const std::vector<uint32_t> starts = balanced_ranges(cost, n_gpus, first, last);
        std::vector<uint32_t> owner(hp.n_layer);
        for (uint32_t g = 0; g < n_gpus; ++g) {
            p.gpus[g].first_layer = starts[g];
            p.gpus[g].end_layer = starts[g + 1];
            for (uint32_t il = starts[g]; il < starts[g + 1]; ++il) {
                owner[il] = g;
                p.gpus[g].state_bytes += state[il];
            }
        }
        for_each_bound(hp, w, [&](const model::TensorSpec &s, const gguf::TensorInfo &t) {
            TensorPlacement tp = unplaced(s, t, n_gpus);
            const uint32_t g = s.layer >= 0 ? owner[static_cast<size_t>(s.layer)]
                                            : (is_output_side(s.name) ? n_gpus - 1 : 0);
            tp.ranges[g] = {0, 1};
            tp.gpu_bytes[g] = t.n_bytes;
            p.gpus[g].weight_bytes += t.n_bytes;
            p.tensors.push_back(std::move(tp));
        });
        return p;
    }

    uint64_t all_state = 0;
    for (uint64_t b : state) all_state += b;
    for (GpuShare &g : p.gpus) {
        g.state_bytes = all_state;  // one KV head: every GPU's heads read all of it
        g.end_layer = hp.n_layer;
    }
    for_each_bound(hp, w, [&](const model::TensorSpec &s, const gguf::TensorInfo &t) {
        TensorPlacement tp = unplaced(s, t, n_gpus);
        const Cut cut = tensor_cut(hp, w, s);
        tp.axis = cut.axis;
        if (cut.axis == ShardAxis::Whole) {
            for (uint32_t g = 0; g < n_gpus; ++g) {
                tp.ranges[g] = {0, 1};
                tp.gpu_bytes[g] = t.n_bytes;
                p.gpus[g].weight_bytes += t.n_bytes;
                p.gpus[g].replicated_bytes += t.n_bytes;
            }
        } else {
            tp.extent = cut.axis == ShardAxis::Rows ? t.dim(1) : t.dim(0);
            const uint64_t block = ggml_type_info(t.type).block_elems;
            if (cut.axis == ShardAxis::Columns && cut.unit % block != 0)
                throw Error(
                    fmt::format("GPU placement: {} is {}, whose blocks of {} values do not "
                                "divide its shard unit of {} columns",
                                s.name, ggml_type_name(t.type), block, cut.unit));
            if (cut.unit == 0 || tp.extent % cut.unit != 0)
                throw Error(fmt::format(
                    "GPU placement: {} has {} {}, not a multiple of its shard "
                    "unit {}",
                    s.name, tp.extent, cut.axis == ShardAxis::Rows ? "rows" : "columns", cut.unit));
            const uint64_t units = tp.extent / cut.unit;
            for (uint32_t g = 0; g < n_gpus; ++g) {
                tp.ranges[g] = {units * g / n_gpus * cut.unit, units * (g + 1) / n_gpus * cut.unit};
                tp.gpu_bytes[g] = part_bytes(t, cut.axis, tp.ranges[g].begin, tp.ranges[g].end);
                p.gpus[g].weight_bytes += tp.gpu_bytes[g];
            }
        }
        p.tensors.push_back(std::move(tp));
    });
    return p;
}

void check_placement_fits(const GpuPlacement &p, const std::vector<uint64_t> &free_bytes,
                          uint64_t headroom) {
    if (free_bytes.size() != p.gpus.size())
        throw Error(fmt::format("GPU placement: planned for {} GPUs, {} found", p.gpus.size(),
                                free_bytes.size()));
    std::string short_of;
    for (size_t g = 0; g < p.gpus.size(); ++g) {
        const GpuShare &s = p.gpus[g];
        if (s.total() + headroom <= free_bytes[g]) continue;
        short_of += fmt::format(
            "{}GPU {} needs {:.2f} GiB ({:.2f} GiB of weights, {:.2f} GiB of attention state "
            "for {} positions, {:.2f} GiB for the backend) and has {:.2f} GiB free",
            short_of.empty() ? "" : "; ", g, gib(s.total() + headroom), gib(s.weight_bytes),
            gib(s.state_bytes), p.ctx, gib(headroom), gib(free_bytes[g]));
    }
    if (!short_of.empty())
        throw Error(
            fmt::format("the {} split does not fit: {}. More GPUs, a shorter context or "
                        "the other split may fit",
                        gpu_split_name(p.split), short_of));
}

std::string describe_placement(const model::HParams &hp, const GpuPlacement &p) {
    std::string out;
    const size_t n = p.gpus.size();
    auto find = [&](const std::string &name) -> const TensorPlacement * {
        for (const TensorPlacement &t : p.tensors)
            if (t.name == name) return &t;
        return nullptr;
    };
    for (size_t g = 0; g < n; ++g) {
        const GpuShare &s = p.gpus[g];
        std::string what;
        if (p.split == GpuSplit::Layers) {
            what = fmt::format("layers {}-{}", s.first_layer, s.end_layer - 1);
            if (g == 0) what += ", token embedding";
            if (g + 1 == n) what += ", output head";
        } else {
            auto units = [&](const TensorPlacement *t, uint64_t unit, const char *label) {
                if (t == nullptr) return std::string();
                const TensorPlacement::Range r = t->ranges[g];
                if (r.end == r.begin) return fmt::format("no {}", label);
                return fmt::format("{} {}-{} of {}", label, r.begin / unit, r.end / unit - 1,
                                   t->extent / unit);
            };
            const uint64_t group_rows = uint64_t(hp.n_head / hp.n_out_group) * hp.head_dim;
            what = units(find("blk.0.attn_q_b.weight"), group_rows, "head groups") + ", " +
                   units(find("blk.0.ffn_down_exps.weight"), 1, "expert hidden columns") + ", " +
                   units(find("output.weight"), 1, "vocabulary rows");
        }
        out += fmt::format(
            "GPU {}: {}; {:.2f} GiB of weights{} + {:.2f} GiB of attention state "
            "= {:.2f} GiB\n",
            g, what, gib(s.weight_bytes),
            p.split == GpuSplit::Tensors
                ? fmt::format(" ({:.2f} GiB on every GPU)", gib(s.replicated_bytes))
                : std::string(),
            gib(s.state_bytes), gib(s.total()));
    }
    return out;
}

}  // namespace ds4::runtime

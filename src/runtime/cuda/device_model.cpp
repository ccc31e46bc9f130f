#include "runtime/cuda/device_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/host_upload.h"
#include "backend/cuda/per_device.h"
#include "common/error.h"
#include "quant/quant.h"
#include "runtime/cuda/cuda_ops.h"

namespace ds4::runtime {

std::unique_ptr<DeviceWeights> upload_to_cuda(
    const model::HParams &hp, const model::ModelWeights &w,
    const std::function<void(uint64_t, uint64_t)> &progress, const DeviceStreaming *streaming,
    DeviceStage stage) {
    return std::make_unique<cuda_backend::DeviceModel>(hp, w, progress, streaming, stage);
}

std::optional<CudaDeviceInfo> cuda_device_info(int device) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) return std::nullopt;
    try {
        const cuda::DeviceScope scope(device);
        cudaDeviceProp prop{};
        size_t free_bytes = 0, total_bytes = 0;
        if (cudaGetDeviceProperties(&prop, device) != cudaSuccess ||
            cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess)
            return std::nullopt;
        return CudaDeviceInfo{prop.name, free_bytes, total_bytes};
    } catch (const Error &) {  // the device cannot be made current
        return std::nullopt;
    }
}

namespace cuda_backend {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

cuda::DeviceBuffer copy_to_device(const void *src, size_t bytes) {
    cuda::DeviceBuffer b(bytes);
    cuda::upload_bytes(b.get(), src, bytes);
    return b;
}

bool is_float_type(GgmlType t) {
    return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

// Device bytes of a tensor in the form DeviceModel keeps it.
uint64_t device_bytes(model::Tensor t, bool as_vector) {
    return as_vector ? t->n_elements * sizeof(float) : t->n_bytes;
}

DeviceMatrix upload_matrix(model::Tensor t, bool experts) {
    DeviceMatrix m;
    m.type = t->type;
    m.k = static_cast<int64_t>(t->dim(0));
    m.n_rows = static_cast<int64_t>(t->dim(1));
    m.n_experts = experts ? static_cast<int64_t>(t->dim(2)) : 1;
    switch (t->type) {
        case GgmlType::Q8_0:
            m.q8_0 = std::make_unique<cuda::Q8_0Weights>(t->data, m.n_rows, m.k, m.n_experts);
            break;
        case GgmlType::IQ2_XXS:
            m.iq2_xxs = std::make_unique<cuda::Iq2xxsWeights>(t->data, m.n_rows, m.k, m.n_experts);
            break;
        case GgmlType::Q2_K:
            m.q2_k = std::make_unique<cuda::Q2KWeights>(t->data, m.n_rows, m.k, m.n_experts);
            break;
        case GgmlType::Q4_K:
            m.q4_k = std::make_unique<cuda::Q4KWeights>(t->data, m.n_rows, m.k, m.n_experts);
            break;
        default:
            if (!is_float_type(t->type))
                throw Error(fmt::format("the CUDA backend has no kernel for {} weights ({})",
                                        ggml_type_name(t->type), t->name));
            if (m.k % 8 != 0)
                throw Error(
                    fmt::format("the CUDA backend needs float rows of a multiple of 8 "
                                "values ({} has {})",
                                t->name, m.k));
            m.raw = copy_to_device(t->data, t->n_bytes);
    }
    return m;
}

// A routed tensor read through the device tier's tables (its planes live in the tier's slots).
DeviceMatrix streamed_matrix(model::Tensor t, const cuda::ExpertTable &table) {
    DeviceMatrix m;
    m.type = t->type;
    m.k = static_cast<int64_t>(t->dim(0));
    m.n_rows = static_cast<int64_t>(t->dim(1));
    m.n_experts = static_cast<int64_t>(t->dim(2));
    switch (t->type) {
        case GgmlType::IQ2_XXS:
            m.iq2_xxs = std::make_unique<cuda::Iq2xxsWeights>(m.n_rows, m.k, m.n_experts, table);
            break;
        case GgmlType::Q2_K:
            m.q2_k = std::make_unique<cuda::Q2KWeights>(m.n_rows, m.k, m.n_experts, table);
            break;
        case GgmlType::Q4_K:
            m.q4_k = std::make_unique<cuda::Q4KWeights>(m.n_rows, m.k, m.n_experts, table);
            break;
        default:  // DeviceExpertTier::layout_of refused it already
            throw Error(fmt::format("CUDA expert streaming: {} weights ({})",
                                    ggml_type_name(t->type), t->name));
    }
    return m;
}

// The device tier's slots for the budget, or (auto) what `room` bytes hold. Not capped here; the
// tier holds at most every expert.
uint64_t tier_slots(const DeviceStreaming &s, uint64_t n_total, uint64_t slot_bytes,
                    uint64_t room) {
    return s.budget.automatic() ? std::min(n_total, room / slot_bytes)
                                : s.budget.slots(n_total, slot_bytes);
}

}  // namespace

DeviceModel::DeviceModel(const model::HParams &hp, const model::ModelWeights &w,
                         const std::function<void(uint64_t, uint64_t)> &progress,
                         const DeviceStreaming *streaming, DeviceStage stage)
    : hp_(hp),
      w_(w),
      device_(stage.device),
      layers_(stage.layers == LayerRange{} ? LayerRange{0, hp.n_layer} : stage.layers) {
    if (streaming && !streaming->host)
        throw Error("CUDA expert streaming: no host tier to stream the experts from");
    if (streaming && layers_.size() != hp.n_layer)
        throw Error("SSD streaming of the routed experts with a layer split is not supported");
    if (layers_.end > hp.n_layer || layers_.begin >= layers_.end)
        throw Error(fmt::format("CUDA backend: layers [{}, {}) of a model of {}", layers_.begin,
                                layers_.end, hp.n_layer));
    int n_devices = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&n_devices); e != cudaSuccess || n_devices == 0)
        throw Error(fmt::format("no CUDA device: {}",
                                e != cudaSuccess ? cudaGetErrorString(e) : "none found"));
    if (device_ < 0 || device_ >= n_devices)
        throw Error(fmt::format("CUDA device {} does not exist: this machine has {} (0 to {})",
                                device_, n_devices, n_devices - 1));
    // Everything below is allocated on the stage's device; the caller's device is put back.
    const cuda::DeviceScope scope(device_);
    cudaDeviceProp prop{};
    DS4_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    device_name_ = prop.name;

    // What goes up, in the model's order: matrices, routed-expert tensors, vectors, tables.
    std::vector<model::Tensor> mats, experts, vecs, tables;
    auto add = [](std::vector<model::Tensor> &to, std::initializer_list<model::Tensor> ts) {
        for (model::Tensor t : ts)
            if (t) to.push_back(t);
    };
    for (uint32_t il = layers_.begin; il < layers_.end; ++il) {
        const model::LayerWeights &L = w.layers[il];
        add(mats,
            {L.hc_attn_fn, L.attn_q_a, L.attn_q_b, L.attn_kv, L.attn_output_a, L.attn_output_b,
             L.comp_kv, L.comp_gate, L.idx_q_b, L.idx_proj, L.idx_comp_kv, L.idx_comp_gate,
             L.hc_ffn_fn, L.ffn_gate_inp, L.ffn_gate_shexp, L.ffn_up_shexp, L.ffn_down_shexp});
        if (!streaming) add(experts, {L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps});
        add(vecs, {L.hc_attn_scale, L.hc_attn_base, L.attn_norm, L.attn_q_a_norm, L.attn_kv_a_norm,
                   L.attn_sinks, L.comp_ape, L.comp_norm, L.idx_comp_ape, L.idx_comp_norm,
                   L.hc_ffn_scale, L.hc_ffn_base, L.ffn_norm, L.exp_probs_b});
        add(tables, {L.tid2eid});
    }
    // The output head with the last layer, the embedding with the first.
    if (layers_.end == hp.n_layer) {
        add(mats, {w.output_hc_fn, w.output});
        add(vecs, {w.output_hc_scale, w.output_hc_base, w.output_norm});
    }
    const bool embeds = layers_.begin == 0;
    const bool embed_as_is =
        w.token_embd->type == GgmlType::F16 || w.token_embd->type == GgmlType::F32;
    uint64_t need = embeds ? device_bytes(w.token_embd, !embed_as_is) : 0;
    for (const auto *list : {&mats, &experts, &tables})
        for (model::Tensor t : *list) need += device_bytes(t, false);
    for (model::Tensor t : vecs) need += device_bytes(t, true);
    size_t free_bytes = 0, total_bytes = 0;
    DS4_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    // Room beyond the weights for sessions' attention state and scratch.
    const uint64_t margin = uint64_t(2) << 30;
    // Streaming: the device tier's slots come on top, at least its floor.
    DeviceExpertTier::Layout layout;
    uint64_t floor_bytes = 0;
    if (streaming) {
        layout = DeviceExpertTier::layout_of(w);
        floor_bytes = uint64_t(hp.n_expert_used) * layout.slot_bytes;
    }
    if (need + floor_bytes + margin > free_bytes)
        throw Error(fmt::format(
            "the weights{} need {:.2f} GiB on the device{} (+{:.0f} GiB for sessions); {} has "
            "{:.2f} GiB free of {:.2f} GiB. {}",
            layers_.size() == hp.n_layer
                ? std::string()
                : fmt::format(" of layers {}-{}", layers_.begin, layers_.end - 1),
            need / kGiB,
            streaming ? fmt::format(" with the routed experts streamed, +{:.2f} GiB for the "
                                    "device tier's floor of {} experts",
                                    floor_bytes / kGiB, hp.n_expert_used)
                      : std::string(),
            margin / kGiB, fmt::format("CUDA device {} ({})", device_, device_name_),
            free_bytes / kGiB, total_bytes / kGiB,
            streaming ? "Use a smaller file or the CPU backend"
                      : "Split the layers over several GPUs (--gpus), stream the routed experts "
                        "(--ssd-streaming, with a device tier of --ssd-streaming-cache-experts), "
                        "use a file that fits, or the CPU backend"));

    uint64_t done = 0;
    auto step = [&](uint64_t bytes) {
        done += bytes;
        if (progress) progress(done, need);
    };
    if (!embeds) {
        // A later stage is handed its token states.
    } else if (embed_as_is) {
        embedding_ = copy_to_device(w.token_embd->data, w.token_embd->n_bytes);
        embedding_type_ = w.token_embd->type;
    } else {  // other formats: rows dequantized to f32 once
        std::vector<float> rows(w.token_embd->n_elements);
        quant::dequantize_row(w.token_embd->type, w.token_embd->data, rows.data(),
                              static_cast<int64_t>(rows.size()));
        embedding_ = copy_to_device(rows.data(), rows.size() * sizeof(float));
        embedding_type_ = GgmlType::F32;
    }
    if (embeds) step(device_bytes(w.token_embd, !embed_as_is));
    for (model::Tensor t : mats) {
        matrices_.emplace(t, upload_matrix(t, false));
        step(device_bytes(t, false));
    }
    for (model::Tensor t : experts) {
        matrices_.emplace(t, upload_matrix(t, true));
        step(device_bytes(t, false));
    }
    for (model::Tensor t : vecs) {
        std::vector<float> v(t->n_elements);
        quant::dequantize_row(t->type, t->data, v.data(), static_cast<int64_t>(v.size()));
        vectors_.emplace(t, copy_to_device(v.data(), v.size() * sizeof(float)));
        step(device_bytes(t, true));
    }
    for (model::Tensor t : tables) {
        // The device clamps ids into range; a table naming a missing expert is refused here,
        // as the CPU refuses it when routing.
        const auto *ids = reinterpret_cast<const int32_t *>(t->data);
        for (uint64_t i = 0; i < t->n_elements; ++i)
            if (ids[i] < 0 || static_cast<uint32_t>(ids[i]) >= hp.n_expert)
                throw Error(fmt::format("{} names expert {} (the model has {})", t->name, ids[i],
                                        hp.n_expert));
        vectors_.emplace(t, copy_to_device(t->data, t->n_bytes));
        step(device_bytes(t, false));
    }
    cuda::release_upload_staging();
    if (streaming) {
        const uint64_t n_total = uint64_t(hp.n_layer) * hp.n_expert;
        size_t free_now = 0;
        DS4_CUDA_CHECK(cudaMemGetInfo(&free_now, &total_bytes));
        const uint64_t room = free_now > margin ? free_now - margin : 0;
        // auto keeps more for sessions than the floor of `margin`: one session at the default
        // chunk (1024) and a 32K context takes ~2 GiB (its batch arena, attention scratch and
        // state), and the server holds one per slot.
        const uint64_t reserve = (uint64_t(4) << 30) + total_bytes / 20;
        const uint64_t auto_room = free_now > reserve ? free_now - reserve : 0;
        const uint64_t slots =
            std::min(n_total, tier_slots(*streaming, n_total, layout.slot_bytes, auto_room));
        const bool automatic = streaming->budget.automatic();
        if (slots < hp.n_expert_used)
            throw Error(fmt::format(
                "CUDA expert streaming: a device tier of {} experts is below the floor of {} (one "
                "token's experts of one layer, {:.2f} MiB each){}",
                slots, hp.n_expert_used, layout.slot_bytes / (1024.0 * 1024.0),
                automatic ? fmt::format(": {:.2f} GiB free after the other weights, {:.2f} GiB "
                                        "kept for sessions",
                                        free_now / kGiB, reserve / kGiB)
                          : std::string()));
        if (slots * layout.slot_bytes > room)
            throw Error(fmt::format(
                "CUDA expert streaming: a device tier of {} experts needs {:.2f} GiB; {} has "
                "{:.2f} GiB free after the other weights, and {:.0f} GiB stay for sessions. Give "
                "a smaller --ssd-streaming-cache-experts (or auto)",
                slots, double(slots * layout.slot_bytes) / kGiB, device_name_, free_now / kGiB,
                margin / kGiB));
        tier_log_.push_back(
            automatic ? fmt::format("CUDA device tier budget auto: {:.2f} GiB free after the other "
                                    "weights - {:.2f} GiB for sessions (4 GiB + 5% of the device)",
                                    free_now / kGiB, reserve / kGiB)
                      : fmt::format("CUDA device tier budget: {} experts", slots));
        tier_ = std::make_unique<DeviceExpertTier>(hp, w, *streaming->host, slots);
        for (const std::string &line : tier_->log()) tier_log_.push_back(line);
        if (!streaming->preload.empty()) {
            const auto t0 = std::chrono::steady_clock::now();
            const uint64_t n = tier_->preload(streaming->preload);
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            tier_log_.push_back(
                fmt::format("CUDA device tier: preloaded {} experts ({:.2f} GiB) of the host "
                            "tier's in {:.2f} s",
                            n, double(n * layout.file_bytes) / kGiB, s));
        }
        for (uint32_t il = 0; il < hp.n_layer; ++il) {
            const model::LayerWeights &L = w.layers[il];
            const model::Tensor parts[3] = {L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps};
            for (int i = 0; i < 3; ++i)
                matrices_.emplace(parts[i], streamed_matrix(parts[i], tier_->table(il, i)));
        }
        need += slots * layout.slot_bytes;
    }
    bytes_ = need;
    for (const auto &[t, m] : matrices_) {
        max_k_ = std::max(max_k_, m.k);
        if (!m.raw.get()) continue;
        cuda::FloatMatrix fm = m.float_matrix();
        float_scratch_ = std::max(float_scratch_, cuda::float_matvec_scratch_bytes(fm));
        if (m.n_experts > 1)
            float_scratch_ = std::max(float_scratch_, cuda::float_matvec_experts_scratch_bytes(
                                                          fm, int(hp.n_expert_used)));
        fm.n_rows = m.n_rows / hp.n_out_group;  // the grouped output's blocks
        if (fm.n_rows > 0)
            float_scratch_ = std::max(float_scratch_, cuda::float_matvec_scratch_bytes(fm));
    }
}

DeviceModel::~DeviceModel() {
    try {
        const cuda::DeviceScope scope(device_);
        tier_.reset();
        matrices_.clear();
        vectors_.clear();
        embedding_ = cuda::DeviceBuffer();
    } catch (...) {  // a device lost: what is left is freed with the process
    }
}

std::vector<std::string> DeviceModel::tier_log() const {
    return tier_log_;
}

std::optional<DeviceTierStats> DeviceModel::tier_stats() const {
    if (!tier_) return std::nullopt;
    return tier_->stats();
}

std::vector<uint64_t> DeviceModel::tier_selection_counts() const {
    return tier_ ? tier_->selection_counts() : std::vector<uint64_t>{};
}

std::pair<size_t, size_t> DeviceModel::float_matmul_scratch_bytes(int64_t m) const {
    std::pair<size_t, size_t> bytes{0, 0};
    for (const auto &[t, mat] : matrices_) {
        if (!mat.raw.get() || mat.n_experts != 1) continue;
        bytes.first =
            std::max(bytes.first, cuda::float_matmul_counter_bytes(mat.float_matrix(), m));
        bytes.second =
            std::max(bytes.second, cuda::float_matmul_partial_bytes(mat.float_matrix(), m));
    }
    return bytes;
}

const DeviceMatrix &DeviceModel::matrix(model::Tensor t) const {
    const auto it = matrices_.find(t);
    if (it == matrices_.end())
        throw Error(fmt::format("CUDA backend: {} is not on the device", t ? t->name : "(null)"));
    return it->second;
}

const float *DeviceModel::vec(model::Tensor t) const {
    if (t == nullptr) return nullptr;
    const auto it = vectors_.find(t);
    if (it == vectors_.end())
        throw Error(fmt::format("CUDA backend: {} is not on the device", t->name));
    return it->second.as<float>();
}

const int32_t *DeviceModel::table(model::Tensor t) const {
    return reinterpret_cast<const int32_t *>(vec(t));
}

std::unique_ptr<Ops> DeviceModel::new_session(uint32_t ctx, bool f16_rows, ForwardOptions opts,
                                              uint32_t max_batch, LayerRange layers) {
    if (opts.llama_cpp_rounding)
        throw Error(
            "llama.cpp's rounding (a comparison mode) is available on the CPU backend only");
    return std::make_unique<CudaOps>(*this, ctx, f16_rows, opts, max_batch, layers);
}

}  // namespace cuda_backend
}  // namespace ds4::runtime

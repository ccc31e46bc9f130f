#pragma once
// The weights of a model on the CUDA device, each in the form its kernels read: Q8_0 and the
// routed-expert formats repacked into planes (backend/cuda/*_matvec.h), float matrices and the
// embedding as in the file, vectors (norms, sinks, biases, hyper-connection scales and bases,
// the compressors' position biases) as f32, the hash-routing tables as int32. Uploaded once per
// model; sessions (runtime/cuda/cuda_ops.h) share them. With streaming, the routed experts are not
// uploaded: their DeviceMatrix reads them through the device tier's tables (device_expert_tier.h),
// which one session at a time fills.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <unordered_map>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/float_matvec.h"
#include "backend/cuda/iq2_xxs_matvec.h"
#include "backend/cuda/q2_k_matvec.h"
#include "backend/cuda/q4_k_matvec.h"
#include "backend/cuda/q8_0_matvec.h"
#include "runtime/cuda/device_expert_tier.h"
#include "runtime/device_weights.h"

namespace ds4::runtime::cuda_backend {

// One matrix, or one routed-expert tensor of n_experts matrices of n_rows x k.
struct DeviceMatrix {
    GgmlType type = GgmlType::F32;
    int64_t n_rows = 0, k = 0, n_experts = 1;
    std::unique_ptr<cuda::Q8_0Weights> q8_0;
    std::unique_ptr<cuda::Iq2xxsWeights> iq2_xxs;
    std::unique_ptr<cuda::Q2KWeights> q2_k;
    std::unique_ptr<cuda::Q4KWeights> q4_k;
    cuda::DeviceBuffer raw;  // F32, F16, BF16 rows as in the file
    cuda::FloatMatrix float_matrix() const { return {type, raw.get(), n_rows, k}; }
    // Whether products take Q8_K activations (IQ2_XXS, Q2_K, Q4_K), Q8_0 ones, or f32 rows.
    bool q8_k_activations() const { return q2_k || q4_k || iq2_xxs; }
};

class DeviceModel final : public DeviceWeights {
  public:
    // The weights of `stage` (its layers; the embedding with layer 0, the output head with the
    // last) on its device.
    DeviceModel(const model::HParams &hp, const model::ModelWeights &w,
                const std::function<void(uint64_t, uint64_t)> &progress,
                const DeviceStreaming *streaming = nullptr, DeviceStage stage = {});
    // The device buffers are freed with their device current.
    ~DeviceModel() override;
    DeviceModel(const DeviceModel &) = delete;
    DeviceModel &operator=(const DeviceModel &) = delete;
    // The device ordinal the weights are on, and their layers.
    int device() const { return device_; }
    LayerRange layers() const { return layers_; }

    std::unique_ptr<Ops> new_session(uint32_t ctx, bool f16_rows, ForwardOptions opts,
                                     uint32_t max_batch, LayerRange layers = {}) override;
    uint64_t bytes() const override { return bytes_; }
    std::string device_name() const override { return device_name_; }
    std::vector<std::string> tier_log() const override;
    std::optional<DeviceTierStats> tier_stats() const override;
    std::vector<uint64_t> tier_selection_counts() const override;
    // The device tier of the streamed routed experts, or null when they are resident.
    DeviceExpertTier *expert_tier() const { return tier_.get(); }

    const model::HParams &hp() const { return hp_; }
    const model::ModelWeights &weights() const { return w_; }
    // The device form of a matrix or expert tensor; throws when it was not uploaded.
    const DeviceMatrix &matrix(model::Tensor t) const;
    // A vector as f32 on the device (null for an absent optional tensor).
    const float *vec(model::Tensor t) const;
    // The int32 hash-routing table of a layer (null when it routes by score).
    const int32_t *table(model::Tensor t) const;
    // The token embedding: rows of F16 or F32.
    const void *embedding() const { return embedding_.get(); }
    GgmlType embedding_type() const { return embedding_type_; }
    // The longest row of any matrix, and the float products' largest scratch (for up to
    // n_expert_used experts at once).
    int64_t max_k() const { return max_k_; }
    size_t float_scratch_bytes() const { return float_scratch_; }
    // The scratch of a batch of m rows through any dense float matrix (cuda::matmul_float):
    // {counter bytes, partial-sum bytes}, each the largest any matrix needs.
    std::pair<size_t, size_t> float_matmul_scratch_bytes(int64_t m) const;

  private:
    const model::HParams &hp_;
    const model::ModelWeights &w_;
    const int device_;
    const LayerRange layers_;
    std::unordered_map<model::Tensor, DeviceMatrix> matrices_;
    std::unordered_map<model::Tensor, cuda::DeviceBuffer> vectors_;
    cuda::DeviceBuffer embedding_;
    GgmlType embedding_type_ = GgmlType::F32;
    uint64_t bytes_ = 0;
    int64_t max_k_ = 0;
    size_t float_scratch_ = 0;
    std::string device_name_;
    std::unique_ptr<DeviceExpertTier> tier_;
    std::vector<std::string> tier_log_;  // the sizing line, then the tier's own lines
};

}  // namespace ds4::runtime::cuda_backend

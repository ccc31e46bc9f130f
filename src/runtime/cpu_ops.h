#pragma once
// The CPU backend of the model order (runtime/ops.h): every operation runs at once, on the
// thread pool, in host memory; the attention state is a KvCache.
#include <memory>
#include <vector>

#include "runtime/batch_buffers.h"
#include "runtime/cpu_context.h"
#include "runtime/kv_cache.h"
#include "runtime/ops.h"

namespace ds4::runtime {

// The CPU backend's saved attention state.
struct CpuState final : BackendState {
    KvCache cache;
    explicit CpuState(KvCache c) : cache(std::move(c)) {}
    size_t payload_bytes() const override;
};

// A rewind point of the CPU backend (Ops::save_tail): the raw windows, the compressors' windows
// and the row counts of every layer.
struct CpuTail final : BackendState {
    struct Layer {
        RowStore raw;
        CompressorState comp_state, idx_state;
        size_t comp_rows = 0, idx_rows = 0;
    };
    int64_t n_past = 0;
    std::vector<Layer> layers;
    size_t payload_bytes() const override;
};

class CpuOps final : public Ops {
  public:
    // The attention state of `layers` only (default: every layer), for a stage of a session
    // whose layers are split (runtime/layer_stages.h).
    CpuOps(const model::HParams &hp, const model::ModelWeights &w, backend::cpu::ThreadPool &pool,
           experts::ExpertSource &experts, ForwardOptions opts, uint32_t ctx, bool f16_rows,
           LayerRange layers = {});

    uint32_t ctx() const override { return cache_.ctx; }
    int64_t n_past() const override { return cache_.n_past; }
    void begin_batch(std::span<const int32_t> tokens) override;
    float *buffer(size_t n) override;
    size_t mark() const override { return buffers_.mark(); }
    void release(size_t mark) override { buffers_.release(mark); }
    void end_batch() override;

    void embed(float *X) override;
    void linear(model::Tensor w, const float *X, float *Y, int64_t m) override;
    void linear_groups(model::Tensor w, uint32_t groups, const float *X, float *Y,
                       int64_t m) override;
    void rms_norm(const float *x, model::Tensor w, float *y, int64_t m, int64_t n) override;
    void hc_pre(const HcWeights &hc, const float *X, int64_t m, float *mix, float *x_in) override;
    void hc_post(const float *mix, const float *y, int64_t m, float *X) override;
    void hc_head(const float *X, float *out) override;
    void attention_core(uint32_t il, const AttentionInputs &in, int64_t m, float *O) override;
    void moe_routed(uint32_t il, const float *XN, const float *logits, int64_t m,
                    float *slot_out) override;
    void swiglu(float *G, const float *U, int64_t m, int64_t n, float clamp) override;
    void moe_sum(const float *slot_out, const float *shared, int64_t m, float *Y) override;
    void read(const float *x, size_t n, float *host) override;
    void write(const float *host, size_t n, float *x) override;

    std::shared_ptr<const BackendState> save() const override;
    void restore(const BackendState &state) override;
    std::shared_ptr<const BackendState> save_tail() const override;
    void rewind(const BackendState &tail) override;
    size_t kv_bytes() const override { return cache_.bytes(); }
    void write_state(std::ostream &out) const override;
    void read_state(std::istream &in, int64_t n_past) override;

  private:
    ForwardContext ctx_;
    KvCache cache_;
    LayerRange layers_;
    std::vector<int32_t> tokens_;  // the current batch
    BatchBuffers buffers_;         // the current batch's buffers, their memory kept for the next
};

}  // namespace ds4::runtime

#include "common/error.h"
#include "experts/expert_source.h"
#include "model/weights.h"

namespace ds4::experts {
namespace {

class ResidentSource : public ExpertSource {
  public:
    explicit ResidentSource(const model::ModelWeights &w) : w_(w) {}

    ExpertBytes get(uint32_t layer, uint32_t expert) override {
        const model::LayerWeights &L = w_.layers.at(layer);
        if (expert >= L.ffn_gate_exps->ne[2])
            throw Error("expert " + std::to_string(expert) + " out of range in layer " +
                        std::to_string(layer));
        // Expert e of a [K, N, n_expert] tensor starts at e * (N * row_bytes) (docs/MODEL.md 2.6).
        auto slab = [&](model::Tensor t) { return t->data + expert * (t->n_bytes / t->ne[2]); };
        return {slab(L.ffn_gate_exps), slab(L.ffn_up_exps), slab(L.ffn_down_exps)};
    }

    bool bytes_stay_valid() const override { return true; }

  private:
    const model::ModelWeights &w_;
};

}  // namespace

std::unique_ptr<ExpertSource> make_resident_source(const model::ModelWeights &weights) {
    return std::make_unique<ResidentSource>(weights);
}

}  // namespace ds4::experts

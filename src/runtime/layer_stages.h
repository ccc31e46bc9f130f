#pragma once
// A session's backends when the model's layers are split into consecutive ranges, each run by
// its own backend instance that holds the attention state of its layers only: a model larger than
// one GPU, over several (docs/MULTI_GPU.md). The model order (forward.h) runs the ranges in
// order and hands the token states from each stage to the next; one stage is the whole model on
// one backend, as a session has when nothing is split.
//
// The session's state operations go to every stage. A saved state is one BackendState per stage;
// the serialised state (write_state) is the one of kv_cache_io.h whatever the split, each layer
// written by the stage that holds it, so a state written by a split session loads into a session
// split otherwise, or not at all, on either backend.
#include <iosfwd>
#include <memory>
#include <span>
#include <vector>

#include "model/hparams.h"
#include "runtime/layer_range.h"
#include "runtime/ops.h"

namespace ds4::runtime {

struct Stage {
    std::unique_ptr<Ops> ops;
    LayerRange layers;
};

// The stages' saved states, one per stage.
struct StagedState final : BackendState {
    std::vector<std::shared_ptr<const BackendState>> parts;
    size_t payload_bytes() const override;
};

class LayerStages {
  public:
    // Throws ds4::Error unless the ranges are non-empty, consecutive and cover every layer (or,
    // `parts`: the stages are the parts of a model split by tensors, each of every layer), and
    // the stages hold the same context and positions. f16_rows: the sessions' row format.
    LayerStages(const model::HParams &hp, std::vector<Stage> stages, bool f16_rows,
                bool parts = false);

    std::span<const Stage> stages() const { return stages_; }
    uint32_t ctx() const { return stages_.front().ops->ctx(); }
    int64_t n_past() const { return stages_.front().ops->n_past(); }

    std::shared_ptr<const BackendState> save() const;
    void restore(const BackendState &state);
    std::shared_ptr<const BackendState> save_tail() const;
    void rewind(const BackendState &tail);
    size_t kv_bytes() const;
    // As Ops::write_state / read_state. read_state checks the whole state before any stage's
    // changes (a failure leaves every stage as it was).
    void write_state(std::ostream &out) const;
    void read_state(std::istream &in, int64_t n_past);

  private:
    const model::HParams &hp_;
    std::vector<Stage> stages_;
    bool f16_rows_;
    bool parts_;  // split by tensors: every stage holds the same attention state
};

// Splits n_layer layers at `starts` (the first layer of every stage after the first, ascending):
// {} -> [0, n_layer); {3} -> [0, 3), [3, n_layer). Throws ds4::Error naming the problem for a
// start of 0, one not above the previous, or one at or past n_layer.
std::vector<LayerRange> split_layers(uint32_t n_layer, std::span<const uint32_t> starts);

}  // namespace ds4::runtime

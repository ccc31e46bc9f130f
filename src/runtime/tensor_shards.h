#pragma once
// One GPU's part of a model split by tensors (GpuSplit::Tensors, runtime/gpu_placement.h): the
// hyper-parameters of the part it computes and its weights, every sharded tensor replaced by
// the rows or columns the plan gives that GPU (copied out of the file), every other tensor the
// file's own. The model order run over such a part (forward.h, ranks) computes that GPU's heads,
// expert hidden columns and vocabulary rows; the partial sums of each sublayer's output
// projection, added over the parts, are the sublayer's output.
//
// The part's hyper-parameters differ from the model's in n_head (its heads: q_b rows over
// head_dim), n_out_group (its output groups) and n_ff_exp (its expert hidden columns, the same in
// every layer, the shared expert's too); n_vocab stays the model's (token ids are the model's),
// and its vocabulary rows are [vocab_begin, vocab_end).
#include <cstdint>
#include <memory>
#include <vector>

#include "gguf/gguf_file.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/gpu_placement.h"

namespace ds4::runtime {

class TensorShard {
  public:
    // Throws ds4::Error for a plan of the Layers split, a rank outside the plan, a sharded
    // tensor of which this rank gets no rows or columns (more GPUs than units: the part would
    // compute nothing), or expert hidden widths that differ between layers.
    TensorShard(const model::HParams &hp, const model::ModelWeights &w, const GpuPlacement &plan,
                uint32_t rank);
    TensorShard(const TensorShard &) = delete;
    TensorShard &operator=(const TensorShard &) = delete;

    const model::HParams &hparams() const { return hp_; }
    const model::ModelWeights &weights() const { return w_; }
    uint64_t vocab_begin() const { return vocab_begin_; }
    uint64_t vocab_end() const { return vocab_end_; }
    // The bytes of the sharded tensors' parts (copies) and of the whole tensors (the file's).
    uint64_t shard_bytes() const { return shard_bytes_; }
    uint64_t whole_bytes() const { return whole_bytes_; }
    // Frees the copies of the sharded tensors once they are on a device (their data pointers
    // become null; the infos stay, as the device copy's keys and shapes).
    void release_bytes();

  private:
    model::HParams hp_;
    model::ModelWeights w_;
    std::vector<std::unique_ptr<gguf::TensorInfo>> parts_;  // the sharded tensors' infos
    std::vector<std::unique_ptr<uint8_t[]>> bytes_;         // and their bytes
    uint64_t vocab_begin_ = 0, vocab_end_ = 0;
    uint64_t shard_bytes_ = 0, whole_bytes_ = 0;
};

}  // namespace ds4::runtime

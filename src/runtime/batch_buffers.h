#pragma once
// The buffers of a CPU batch (Ops::buffer), kept from batch to batch: the i-th buffer a batch
// takes reuses the memory of the i-th buffer taken before it (by an earlier batch, or earlier in
// this one before a release), grown when it is too small, and not filled (but with a fill value,
// for tests). The model order takes the same sequence of buffers for every layer and every
// batch, so a batch allocates only at its first layer. As fresh zero-filled vectors, a 256-token
// chunk's buffers (~120 MB a layer) were mapped page by page and filled on one thread at every
// layer, work that did not shrink with the thread count (docs/PERFORMANCE.md). The CPU backend
// gives the memory back when a one-token batch follows a larger one (free_all), so that a
// session does not hold a prefill chunk's buffers (~120 MB for Flash in chunks of 256, ~0.5 GB
// in 1,024) while it decodes.
#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

namespace ds4::runtime {

class BatchBuffers {
  public:
    // fill: the value every buffer is filled with when it is taken (ForwardOptions::buffer_fill);
    // none: buffers are not filled.
    explicit BatchBuffers(std::optional<float> fill = std::nullopt) : fill_(fill) {}

    // n floats, their values unspecified; valid until release(mark) with a mark at or below the
    // count before this call, or clear().
    float *take(size_t n);
    // The count of buffers taken; release(mark) gives back those taken after it.
    size_t mark() const { return used_; }
    void release(size_t mark);
    void clear() { used_ = 0; }
    // Gives the memory of every buffer back (all of them must be released).
    void free_all();
    // Floats held (kept for reuse), for tests and logs.
    size_t capacity() const;

  private:
    struct Block {
        std::unique_ptr<float[]> data;
        size_t size = 0;
    };
    std::vector<Block> blocks_;
    size_t used_ = 0;
    std::optional<float> fill_;
};

}  // namespace ds4::runtime

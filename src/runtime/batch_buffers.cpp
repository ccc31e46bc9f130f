#include "runtime/batch_buffers.h"

#include <algorithm>

namespace ds4::runtime {

float *BatchBuffers::take(size_t n) {
    if (used_ == blocks_.size()) blocks_.emplace_back();
    Block &b = blocks_[used_++];
    if (b.size < n || !b.data) {
        b.data = std::make_unique_for_overwrite<float[]>(n);
        b.size = n;
    }
    if (fill_) std::fill_n(b.data.get(), n, *fill_);
    return b.data.get();
}

void BatchBuffers::release(size_t mark) {
    used_ = std::min(used_, mark);
}

void BatchBuffers::free_all() {
    blocks_.clear();
    used_ = 0;
}

size_t BatchBuffers::capacity() const {
    size_t n = 0;
    for (const Block &b : blocks_) n += b.size;
    return n;
}

}  // namespace ds4::runtime

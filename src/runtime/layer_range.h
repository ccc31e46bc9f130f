#pragma once
// A range of consecutive layers [begin, end): the layers one backend instance runs when a
// model's layers are split over several (runtime/layer_stages.h).
#include <cstdint>

namespace ds4::runtime {

struct LayerRange {
    uint32_t begin = 0, end = 0;
    bool contains(uint32_t il) const { return il >= begin && il < end; }
    uint32_t size() const { return end - begin; }
    bool operator==(const LayerRange &) const = default;
};

}  // namespace ds4::runtime

#include "quant/kernel_scratch.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

#include "common/error.h"

namespace ds4::quant {
namespace {

constexpr size_t kAlign = 64;

struct FreeAligned {
    void operator()(void *p) const { std::free(p); }
};

struct Buffer {
    std::unique_ptr<void, FreeAligned> data;
    size_t bytes = 0;
};

thread_local Buffer t_buffers[kKernelScratchSlots];

}  // namespace

void *kernel_scratch(int slot, size_t bytes) {
    if (slot < 0 || slot >= kKernelScratchSlots)
        throw Error("kernel_scratch: no slot " + std::to_string(slot));
    Buffer &buf = t_buffers[slot];
    if (bytes > buf.bytes || buf.data == nullptr) {
        const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
        buf.data.reset();
        buf.bytes = 0;
        void *p = std::aligned_alloc(kAlign, rounded);
        if (p == nullptr) throw std::bad_alloc();
        buf.data.reset(p);
        buf.bytes = rounded;
    }
    return buf.data.get();
}

}  // namespace ds4::quant

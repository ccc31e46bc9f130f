#pragma once
// Per-thread scratch for the multi-row kernels (the repacked weight panel of a Q8_0 product and
// its activation tables), so that the kernel files, compiled for one instruction set, allocate
// nothing themselves and instantiate no std:: template (simd_x86_common.h says why).
#include <cstddef>

namespace ds4::quant {

constexpr int kKernelScratchSlots = 2;

// A 64-byte aligned buffer of at least `bytes` bytes that belongs to the calling thread, one per
// slot (0 <= slot < kKernelScratchSlots). It stays valid, with its contents, until the same
// thread asks for the same slot again; growing it loses the contents.
void *kernel_scratch(int slot, size_t bytes);

}  // namespace ds4::quant

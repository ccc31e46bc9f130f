#pragma once
// Where each expert of a routed [n_experts][n_rows][k] tensor lies in device memory: a device
// array of the experts' quant-plane pointers and one of their scale-plane pointers (each plane
// [n_rows][k / 256][...] of the format). The routed kernels (expert_matvec.cuh,
// expert_matmul.cuh, expert_mma.cuh) reach an expert's weights through it with the ids they
// read on the device, so the table may point at a resident tensor (ResidentExpertTable: expert
// e at base + e * stride) or at slots of an expert cache whose contents change between steps:
// the kernels, and a captured graph of them, stay the same.
#include <cstddef>
#include <cstdint>

#include "backend/cuda/device_buffer.h"

namespace ds4::cuda {

struct ExpertTable {
    const uint8_t *const *qs = nullptr;      // [n_experts] device pointers
    const uint8_t *const *scales = nullptr;  // [n_experts] device pointers
};

// The table of a tensor resident in device memory: expert e's planes at qs + e * qs_stride and
// scales + e * scales_stride (bytes).
class ResidentExpertTable {
  public:
    ResidentExpertTable() = default;
    ResidentExpertTable(const void *qs, size_t qs_stride, const void *scales, size_t scales_stride,
                        int64_t n_experts);
    const ExpertTable &table() const { return view_; }

  private:
    DeviceBuffer pointers_;  // [qs pointers][scale pointers]
    ExpertTable view_;
};

}  // namespace ds4::cuda

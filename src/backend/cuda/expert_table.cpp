#include "backend/cuda/expert_table.h"

#include <vector>

#include "common/error.h"

namespace ds4::cuda {

ResidentExpertTable::ResidentExpertTable(const void *qs, size_t qs_stride, const void *scales,
                                         size_t scales_stride, int64_t n_experts) {
    if (n_experts < 1) throw ds4::Error("an expert table needs at least one expert");
    std::vector<const uint8_t *> host(2 * size_t(n_experts));
    for (int64_t e = 0; e < n_experts; ++e) {
        host[size_t(e)] = static_cast<const uint8_t *>(qs) + size_t(e) * qs_stride;
        host[size_t(n_experts + e)] =
            static_cast<const uint8_t *>(scales) + size_t(e) * scales_stride;
    }
    pointers_ = DeviceBuffer(host.size() * sizeof(host[0]));
    DS4_CUDA_CHECK(
        cudaMemcpy(pointers_.get(), host.data(), pointers_.bytes(), cudaMemcpyHostToDevice));
    const auto *p = pointers_.as<const uint8_t *>();
    view_ = {p, p + n_experts};
}

}  // namespace ds4::cuda

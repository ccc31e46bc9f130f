// upload_to_cuda of a build without the CUDA backend (DS4_CUDA=OFF).
#include "common/error.h"
#include "runtime/device_weights.h"

namespace ds4::runtime {

std::unique_ptr<DeviceWeights> upload_to_cuda(const model::HParams &, const model::ModelWeights &,
                                              const std::function<void(uint64_t, uint64_t)> &,
                                              const DeviceStreaming *, DeviceStage) {
    throw Error(
        "this build has no CUDA backend: configure with -DDS4_CUDA=ON on a machine with nvcc");
}

std::optional<CudaDeviceInfo> cuda_device_info(int) {
    return std::nullopt;
}

}  // namespace ds4::runtime

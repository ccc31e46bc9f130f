#pragma once
// The backends a model can run on, and the device copy of its weights for the GPU backend.
// The session API names a backend and nothing else of it: a session over a model on a device
// gets its operations (runtime/ops.h) from that model's DeviceWeights.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/error.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "runtime/forward_options.h"
#include "runtime/ops.h"

namespace ds4::runtime {

enum class Backend { Cpu, Cuda };
const char *backend_name(Backend b);  // "cpu" | "cuda"
// "cpu" | "cuda"; throws ds4::Error naming the choices otherwise.
Backend parse_backend(const std::string &name);

class DeviceWeights {
  public:
    virtual ~DeviceWeights() = default;
    // A session's operations: its attention state for ctx positions (rows rounded to f16 or
    // kept f32) and scratch for batches of up to max_batch tokens.
    virtual std::unique_ptr<Ops> new_session(uint32_t ctx, bool f16_rows, ForwardOptions opts,
                                             uint32_t max_batch) = 0;
    virtual uint64_t bytes() const = 0;  // device memory the weights take
    virtual std::string device_name() const = 0;
};

// The model file is good but its backend could not start: no CUDA backend in this build, no
// device or driver answers, the weights do not fit the device (Model::load throws it for any
// failure of the upload, after the file has been read and checked).
class BackendUnavailable : public Error {
  public:
    using Error::Error;
};

// Copies the weights to the first CUDA device. Throws ds4::Error when this build has no CUDA
// backend, no device or driver answers, or the weights do not fit (saying how much is needed).
std::unique_ptr<DeviceWeights> upload_to_cuda(
    const model::HParams &hp, const model::ModelWeights &w,
    const std::function<void(uint64_t, uint64_t)> &progress);

}  // namespace ds4::runtime

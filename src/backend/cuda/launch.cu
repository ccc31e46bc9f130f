#include <cstdlib>
#include <string>

#include "backend/cuda/launch.cuh"

namespace ds4::cuda {
namespace {

// A comparison switch: on unless the environment variable `name` is "0".
bool on_unless_zero(const char *name) {
    const char *v = std::getenv(name);
    return v == nullptr || std::string(v) != "0";
}

}  // namespace

bool pdl_enabled() {
    static const bool on = on_unless_zero("DS4_CUDA_PDL");
    return on;
}

bool mma_enabled() {
    static const bool on = on_unless_zero("DS4_CUDA_MMA");
    return on;
}

bool float_mma_enabled() {
    static const bool on = on_unless_zero("DS4_CUDA_FLOAT_MMA");
    return on;
}

bool float_mma_every_shape() {
    const char *v = std::getenv("DS4_CUDA_FLOAT_MMA");
    static const bool all = v != nullptr && std::string(v) == "all";
    return all;
}

bool staged_q8_0_enabled() {
    static const bool on = on_unless_zero("DS4_CUDA_STAGED_Q8_0");
    return on;
}

bool staged_attention_enabled() {
    static const bool on = on_unless_zero("DS4_CUDA_STAGED");
    return on;
}

}  // namespace ds4::cuda

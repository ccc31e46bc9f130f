#include <cstdlib>
#include <string>

#include "backend/cuda/launch.cuh"

namespace ds4::cuda {

bool pdl_enabled() {
    static const bool on = [] {
        const char *v = std::getenv("DS4_CUDA_PDL");
        return v == nullptr || std::string(v) != "0";
    }();
    return on;
}

bool mma_enabled() {
    static const bool on = [] {
        const char *v = std::getenv("DS4_CUDA_MMA");
        return v == nullptr || std::string(v) != "0";
    }();
    return on;
}

bool staged_attention_enabled() {
    static const bool on = [] {
        const char *v = std::getenv("DS4_CUDA_STAGED");
        return v == nullptr || std::string(v) != "0";
    }();
    return on;
}

}  // namespace ds4::cuda

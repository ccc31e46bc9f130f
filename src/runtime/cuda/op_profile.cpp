#include "runtime/cuda/op_profile.h"

#include "backend/cuda/cuda_check.h"

namespace ds4::runtime::cuda_backend {

OpProfile::OpProfile() : on_(profile_requested("DS4_CUDA_PROFILE")) {}

OpProfile::~OpProfile() {
    for (const Pending &p : pending_) {
        cudaEventDestroy(p.start);
        cudaEventDestroy(p.stop);
    }
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t OpProfile::event() {
    if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
    }
    cudaEvent_t e;
    DS4_CUDA_CHECK(cudaEventCreate(&e));
    return e;
}

size_t OpProfile::begin(cudaStream_t s, std::string key, double bytes) {
    Pending p{event(), event(), std::move(key), bytes, batch_ > 1};
    DS4_CUDA_CHECK(cudaEventRecord(p.start, s));
    pending_.push_back(std::move(p));
    return pending_.size() - 1;
}

void OpProfile::end(cudaStream_t s, size_t call) {
    DS4_CUDA_CHECK(cudaEventRecord(pending_.at(call).stop, s));
}

void OpProfile::collect() {
    for (Pending &p : pending_) {
        float ms = 0;
        DS4_CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
        table(p.prefill).add(p.key, ms, p.bytes);
        free_.push_back(p.start);
        free_.push_back(p.stop);
    }
    pending_.clear();
}

void OpProfile::report() const {
    if (!on_) return;
    decode_.report("CUDA profile, decode (one-token batches)");
    prefill_.report("CUDA profile, prefill (batches of several tokens)");
}

}  // namespace ds4::runtime::cuda_backend

#pragma once
// Owned device memory: one cudaMalloc, freed on destruction. Plain allocations only (no
// managed memory: oversubscribing it can hang the GPU instead of failing the allocation).
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace ds4::cuda {

class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
        if (bytes) DS4_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;
    DeviceBuffer(DeviceBuffer &&o) noexcept
        : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    DeviceBuffer &operator=(DeviceBuffer &&o) noexcept {
        if (this != &o) {
            release();
            ptr_ = std::exchange(o.ptr_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    ~DeviceBuffer() { release(); }

    void *get() const { return ptr_; }
    template <typename T>
    T *as() const {
        return static_cast<T *>(ptr_);
    }
    size_t bytes() const { return bytes_; }

  private:
    void release() noexcept {
        if (ptr_) cudaFree(ptr_);
        ptr_ = nullptr;
        bytes_ = 0;
    }
    void *ptr_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace ds4::cuda

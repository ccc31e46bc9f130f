#pragma once
// Set-up that each CUDA device needs once: a kernel's function attributes (its dynamic shared
// memory limit) and the __device__ tables are per device, so a process whose stages run on
// several GPUs must do them on every device it launches on, not once per process.
#include <cuda_runtime.h>

#include <array>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "common/error.h"

namespace ds4::cuda {

// The current device's ordinal.
inline int current_device() {
    int device = 0;
    DS4_CUDA_CHECK(cudaGetDevice(&device));
    return device;
}

// A value each device computes once, the first time get() is called on it (the current device):
// get(init) returns init()'s result for this device, calling init only the first time. Thread-safe;
// an exception from init leaves the device to be tried again.
template <class T>
class PerDevice {
  public:
    template <class F>
    T get(F &&init) {
        const int device = current_device();
        if (device < 0 || device >= kMaxDevices)
            throw Error("CUDA device ordinal out of range for per-device set-up");
        std::lock_guard lock(mutex_);
        if (!done_[device]) {
            values_[device] = init();
            done_[device] = true;
        }
        return values_[device];
    }

  private:
    static constexpr int kMaxDevices = 64;
    std::mutex mutex_;
    std::array<bool, kMaxDevices> done_{};
    std::array<T, kMaxDevices> values_{};
};

// The current device for a scope: sets `device` and puts back the one that was current.
class DeviceScope {
  public:
    explicit DeviceScope(int device) : previous_(current_device()) {
        if (device != previous_) DS4_CUDA_CHECK(cudaSetDevice(device));
    }
    ~DeviceScope() {
        int now = 0;
        if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
    }
    DeviceScope(const DeviceScope &) = delete;
    DeviceScope &operator=(const DeviceScope &) = delete;

  private:
    int previous_;
};

// For an object whose members hold memory of one device: declared before them (so destroyed after
// them) and armed in the constructor or destructor, it keeps that device current while they are
// freed and then puts back the device that was current before. disarm() puts it back at once
// (the end of a constructor that succeeded). Never throws.
class DeviceRestore {
  public:
    DeviceRestore() = default;
    DeviceRestore(const DeviceRestore &) = delete;
    DeviceRestore &operator=(const DeviceRestore &) = delete;
    ~DeviceRestore() { disarm(); }
    void arm(int device) noexcept {
        disarm();
        if (cudaGetDevice(&previous_) != cudaSuccess) return;
        armed_ = previous_ == device || cudaSetDevice(device) == cudaSuccess;
    }
    void disarm() noexcept {
        if (armed_) cudaSetDevice(previous_);
        armed_ = false;
    }

  private:
    int previous_ = 0;
    bool armed_ = false;
};

}  // namespace ds4::cuda

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/host_upload.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/per_device.h"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr size_t kChunk = size_t(64) << 20;

// A thread block takes kSplitTile bytes' worth of whole blocks: it reads them into shared memory
// with consecutive threads on consecutive bytes (4-byte words where the tile is aligned), then
// writes plane a's part of the tile and plane b's, each contiguous, the same way. The device tier
// repacks every missed expert: one thread a block, reading and writing a byte at a time 66 or 84
// bytes apart from its neighbours', took 30.3 us for a 2.16 MB IQ2_XXS part on an H100, this
// kernel 5.5 (bench_cuda_matvec).
constexpr int kSplitTile = 8192, kSplitThreads = 256;

__global__ void __launch_bounds__(kSplitThreads)
    split_blocks_kernel(const uint8_t *__restrict__ src, int64_t n_blocks, int block_bytes,
                        int seg_off, int seg_len, uint8_t *__restrict__ a,
                        uint8_t *__restrict__ b) {
    dev::wait_for_previous_kernels();
    __shared__ __align__(16) uint8_t tile[kSplitTile];
    const int per_tile = kSplitTile / block_bytes;
    const int64_t i0 = int64_t(blockIdx.x) * per_tile;
    const int g = int(min(int64_t(per_tile), n_blocks - i0)), n = g * block_bytes;
    const uint8_t *from = src + i0 * block_bytes;
    if (reinterpret_cast<uintptr_t>(from) % 4 == 0) {
        const auto *w = reinterpret_cast<const uint32_t *>(from);
        for (int k = int(threadIdx.x); k < n / 4; k += kSplitThreads)
            reinterpret_cast<uint32_t *>(tile)[k] = w[k];
        for (int k = n / 4 * 4 + int(threadIdx.x); k < n; k += kSplitThreads) tile[k] = from[k];
    } else {
        for (int k = int(threadIdx.x); k < n; k += kSplitThreads) tile[k] = from[k];
    }
    __syncthreads();
    const int la = seg_len, lb = block_bytes - seg_len;
    uint8_t *to_a = a + i0 * la, *to_b = b + i0 * lb;
    for (int k = int(threadIdx.x); k < g * la; k += kSplitThreads)
        to_a[k] = tile[(k / la) * block_bytes + seg_off + k % la];
    for (int k = int(threadIdx.x); k < g * lb; k += kSplitThreads) {
        const int w = k % lb;
        to_b[k] = tile[(k / lb) * block_bytes + (w < seg_off ? w : w + seg_len)];
    }
}

// The split's arguments: a segment inside the block, a block that fits the kernel's tile.
void check_split(const char *who, int block_bytes, int seg_off, int seg_len) {
    if (block_bytes <= 0 || seg_off < 0 || seg_len < 0 || seg_off + seg_len > block_bytes)
        throw ds4::Error(std::string(who) + ": a segment outside the block");
    if (block_bytes > kSplitTile)
        throw ds4::Error(std::string(who) + ": blocks of " + std::to_string(block_bytes) +
                         " bytes (at most " + std::to_string(kSplitTile) + ")");
}

// memcpy on up to 8 host threads (page faults of a fresh mapping and the copy both scale).
void parallel_memcpy(void *dst, const void *src, size_t n) {
    const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency() / 2, 1, 8);
    const size_t part = (n / threads + 4095) / 4096 * 4096;
    if (threads == 1 || n < (size_t(4) << 20)) {
        std::memcpy(dst, src, n);
        return;
    }
    std::vector<std::future<void>> parts;
    for (size_t off = part; off < n; off += part)
        parts.push_back(std::async(std::launch::async, [=] {
            std::memcpy(static_cast<uint8_t *>(dst) + off, static_cast<const uint8_t *>(src) + off,
                        std::min(part, n - off));
        }));
    std::memcpy(dst, src, std::min(part, n));
    for (auto &p : parts) p.get();
}

class Stager {
  public:
    Stager() {
        DS4_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        for (int i = 0; i < 2; ++i)
            DS4_CUDA_CHECK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
    // Never destroyed (destroying CUDA objects after the runtime has shut down would fail); the
    // buffers are freed by release(), the stream and events stay.
    void release() {
        for (int i = 0; i < 2; ++i) {
            if (pinned_[i]) DS4_CUDA_CHECK(cudaFreeHost(pinned_[i]));
            if (staging_[i]) DS4_CUDA_CHECK(cudaFree(staging_[i]));
            pinned_[i] = nullptr;
            staging_[i] = nullptr;
        }
    }

    // For each chunk of at most `chunk` bytes: the host copy into pinned memory, then
    // `send(pinned, offset, length, slot)` enqueues its transfer (and any kernel) on stream().
    template <typename Send>
    void run(const void *src, size_t bytes, size_t chunk, Send send) {
        size_t i = 0;
        for (size_t off = 0; off < bytes; off += chunk, ++i) {
            const int slot = int(i % 2);
            const size_t n = std::min(chunk, bytes - off);
            DS4_CUDA_CHECK(cudaEventSynchronize(done_[slot]));  // its previous chunk has gone
            if (!pinned_[slot]) DS4_CUDA_CHECK(cudaMallocHost(&pinned_[slot], kChunk));
            parallel_memcpy(pinned_[slot], static_cast<const uint8_t *>(src) + off, n);
            send(pinned_[slot], off, n, slot);
            DS4_CUDA_CHECK(cudaEventRecord(done_[slot], stream_));
        }
        DS4_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    cudaStream_t stream() const { return stream_; }
    // Device staging of the raw blocks of a chunk (split uploads), allocated at first use.
    uint8_t *device_staging(int slot) {
        if (!staging_[slot]) DS4_CUDA_CHECK(cudaMalloc(&staging_[slot], kChunk));
        return staging_[slot];
    }
    std::mutex mutex;

  private:
    cudaStream_t stream_ = nullptr;
    void *pinned_[2] = {nullptr, nullptr};
    uint8_t *staging_[2] = {nullptr, nullptr};
    cudaEvent_t done_[2] = {nullptr, nullptr};
};

// The current device's: its stream, events and device staging belong to that device (a kernel
// cannot be launched on another device's stream).
Stager &stager() {
    static PerDevice<Stager *> stagers;
    return *stagers.get([] { return new Stager(); });
}

}  // namespace

void release_upload_staging() {  // the current device's
    Stager &st = stager();
    const std::lock_guard<std::mutex> lock(st.mutex);
    st.release();
}

void upload_bytes(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return;
    Stager &st = stager();
    const std::lock_guard<std::mutex> lock(st.mutex);
    st.run(src, bytes, kChunk, [&](const void *pinned, size_t off, size_t n, int) {
        DS4_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t *>(dst) + off, pinned, n,
                                       cudaMemcpyHostToDevice, st.stream()));
    });
}

void upload_split_blocks(const void *src, int64_t n_blocks, int block_bytes, int seg_off,
                         int seg_len, void *plane_a, void *plane_b) {
    check_split("upload_split_blocks", block_bytes, seg_off, seg_len);
    if (n_blocks <= 0) return;
    Stager &st = stager();
    const std::lock_guard<std::mutex> lock(st.mutex);
    const size_t chunk = kChunk / size_t(block_bytes) * size_t(block_bytes);
    st.run(src, size_t(n_blocks) * size_t(block_bytes), chunk,
           [&](const void *pinned, size_t off, size_t n, int slot) {
               uint8_t *raw = st.device_staging(slot);
               DS4_CUDA_CHECK(cudaMemcpyAsync(raw, pinned, n, cudaMemcpyHostToDevice, st.stream()));
               const int64_t first = int64_t(off / size_t(block_bytes)),
                             count = int64_t(n / size_t(block_bytes));
               split_blocks_async(raw, count, block_bytes, seg_off, seg_len,
                                  static_cast<uint8_t *>(plane_a) + first * seg_len,
                                  static_cast<uint8_t *>(plane_b) + first * (block_bytes - seg_len),
                                  st.stream());
           });
}

void split_blocks_async(const void *src, int64_t n_blocks, int block_bytes, int seg_off,
                        int seg_len, void *plane_a, void *plane_b, cudaStream_t stream) {
    check_split("split_blocks_async", block_bytes, seg_off, seg_len);
    if (n_blocks <= 0) return;
    const int64_t per_tile = kSplitTile / block_bytes;
    launch_kernel(split_blocks_kernel, unsigned((n_blocks + per_tile - 1) / per_tile),
                  kSplitThreads, 0, stream, static_cast<const uint8_t *>(src), n_blocks,
                  block_bytes, seg_off, seg_len, static_cast<uint8_t *>(plane_a),
                  static_cast<uint8_t *>(plane_b));
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda

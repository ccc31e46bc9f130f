#pragma once
// Host-to-device upload of model bytes (the file's mapping) at the copy engines' speed: chunks
// are copied by several host threads into one of two pinned staging buffers while the other's
// chunk crosses the bus, so the host copy of chunk i + 1 overlaps the transfer of chunk i (a
// cudaMemcpy from pageable memory does neither, and moved the q2 Flash file at ~1.2 GB/s).
//
// upload_split_blocks also repacks a block format into the two planes the kernels read (each
// block's bytes [seg_off, seg_off + seg_len) into plane a, the others, in order, into plane b),
// on the device after the transfer: the CPU twins are the formats' repack_* functions, compared
// in tests/cuda/test_cuda_host_upload.cpp.
//
// Both return when the bytes are on the device. One upload runs at a time (a process-wide
// staging area, guarded by a mutex: 128 MiB pinned and, for split uploads, 128 MiB on the
// device, allocated at first use and freed by release_upload_staging, e.g. once a model is up).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ds4::cuda {

void upload_bytes(void *dst, const void *src, size_t bytes);

void upload_split_blocks(const void *src, int64_t n_blocks, int block_bytes, int seg_off,
                         int seg_len, void *plane_a, void *plane_b);

void release_upload_staging();

// The same repack of n_blocks blocks already on the device (src), enqueued on `stream`: what
// upload_split_blocks does to each chunk after its transfer (the streamed experts' slots are
// filled this way, runtime/cuda/device_expert_tier.h).
void split_blocks_async(const void *src, int64_t n_blocks, int block_bytes, int seg_off,
                        int seg_len, void *plane_a, void *plane_b, cudaStream_t stream);

}  // namespace ds4::cuda

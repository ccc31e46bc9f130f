#pragma once
// Copies from global to shared memory that do not pass through registers (PTX cp.async, sm_80
// and later): a thread issues many 16-byte copies at once, each lands in shared memory when its
// bytes arrive, and the block waits for a whole group of them. A block can thus have all of its
// operands in flight at once instead of the few that fit a thread's registers.
#include <cstdint>

namespace ds4::cuda::dev {

// 16 bytes from src (16-byte aligned, global) to dst (16-byte aligned, shared); with valid
// false, 16 zero bytes and nothing is read (src must still be a valid address).
__device__ __forceinline__ void copy_16_async(void *dst, const void *src, bool valid) {
    const auto smem = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

// 4 bytes from src (4-byte aligned, global) to dst (shared).
__device__ __forceinline__ void copy_4_async(void *dst, const void *src) {
    const auto smem = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem), "l"(src) : "memory");
}

// The copies issued by this thread since its last commit form one group.
__device__ __forceinline__ void commit_async_copies() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Returns once at most `pending` of this thread's groups are still in flight (0..7; a larger
// value waits for all). Other threads' copies are seen after a __syncthreads().
__device__ __forceinline__ void wait_async_copies(int pending) {
    switch (pending) {
        case 7:
            asm volatile("cp.async.wait_group 7;\n" ::: "memory");
            break;
        case 6:
            asm volatile("cp.async.wait_group 6;\n" ::: "memory");
            break;
        case 5:
            asm volatile("cp.async.wait_group 5;\n" ::: "memory");
            break;
        case 4:
            asm volatile("cp.async.wait_group 4;\n" ::: "memory");
            break;
        case 3:
            asm volatile("cp.async.wait_group 3;\n" ::: "memory");
            break;
        case 2:
            asm volatile("cp.async.wait_group 2;\n" ::: "memory");
            break;
        case 1:
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
            break;
        default:
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
            break;
    }
}

}  // namespace ds4::cuda::dev

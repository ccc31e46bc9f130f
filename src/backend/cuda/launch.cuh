#pragma once
// Kernel launches with programmatic dependent launch (PDL): a kernel may be scheduled while the
// previous kernel on its stream is finishing, and waits at its first statement
// (wait_for_previous_kernels, PTX griddepcontrol.wait) until that kernel has completed and its
// writes are visible. What this hides is the launch latency between dependent kernels of a decode
// step (a few thousand small kernels, ~1-2 us each otherwise); what a kernel computes is
// unchanged. Every kernel of this folder begins with the wait, so a launch with the attribute
// is safe whatever precedes it. DS4_CUDA_PDL=0 launches without the attribute (for comparisons).
#include <cuda_runtime.h>

#include <type_traits>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace ds4::cuda {

// The dynamic shared memory a kernel of this folder may ask for: under the 227 KiB a block may
// have on sm_90, with room left for a kernel's static arrays.
constexpr int kMaxDynamicSharedBytes = 200 * 1024;

bool pdl_enabled();
// The prefill products on int8 tensor cores (q8_0_matmul.h, expert_mma.cuh; the same bits as
// the kernels they replace); DS4_CUDA_MMA=0 keeps the dp4a kernels, for comparisons.
bool mma_enabled();
// One token's attention scores and mix with their operands staged by cp.async
// (attention_decode.cu; the same bits as the kernels they replace); DS4_CUDA_STAGED=0 keeps the
// register-staged kernels, for comparisons.
bool staged_attention_enabled();
// The batched Q8_0 product with its activations staged in shared memory (q8_0_matmul.cu; the
// same bits); DS4_CUDA_STAGED_Q8_0=0 reads them from memory, for comparisons.
bool staged_q8_0_enabled();
// The float products of float_mma.h's shapes on the fp64 tensor cores (float_mma.cu; their own
// order, the same for one token and a batch); DS4_CUDA_FLOAT_MMA=0 keeps every float product on
// the thread kernels (float_matvec.cu), for comparisons.
bool float_mma_enabled();
// DS4_CUDA_FLOAT_MMA=all: every float matrix of up to 8,192 rows there, for comparisons.
bool float_mma_every_shape();

// f(std::integral_constant<int, TPR>{}) for a kernel's threads per row, one of 256, 128, 64 or
// 32 (anything else: 32): the matvecs pick TPR at run time and compile one kernel for each.
template <class F>
void with_threads_per_row(int tpr, F &&f) {
    switch (tpr) {
        case 256:
            f(std::integral_constant<int, 256>{});
            break;
        case 128:
            f(std::integral_constant<int, 128>{});
            break;
        case 64:
            f(std::integral_constant<int, 64>{});
            break;
        default:
            f(std::integral_constant<int, 32>{});
            break;
    }
}

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args &&...args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = pdl_enabled() ? 1 : 0;
    DS4_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

namespace dev {

// The first statement of every kernel: returns once the kernels this one depends on have
// completed (at once for a launch without the PDL attribute).
__device__ __forceinline__ void wait_for_previous_kernels() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

}  // namespace dev
}  // namespace ds4::cuda

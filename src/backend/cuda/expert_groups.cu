#include "backend/cuda/cuda_check.h"
#include "backend/cuda/expert_groups.h"
#include "backend/cuda/launch.cuh"
#include "common/error.h"

namespace ds4::cuda {
namespace {

constexpr int kMaxExperts = 1024;

// One warp, pairs 32 at a time in order: the lanes naming the same expert find each other
// (__match_any_sync) and take consecutive places after the expert's cursor, lower lanes first.
// Pass 1 counts, an exclusive scan gives the offsets, pass 2 places.
__global__ void group_kernel(const int32_t *__restrict__ ids, int n_pairs, int n_expert,
                             int32_t *__restrict__ offsets, int32_t *__restrict__ order) {
    dev::wait_for_previous_kernels();
    __shared__ int cursor[kMaxExperts];
    const int lane = threadIdx.x;
    for (int e = lane; e < n_expert; e += 32) cursor[e] = 0;
    __syncwarp();
    const unsigned below = (1u << lane) - 1;
    for (int pass = 0; pass < 2; ++pass) {
        for (int base = 0; base < n_pairs; base += 32) {
            const int p = base + lane;
            const bool on = p < n_pairs;
            const int e = on ? ids[p] : -1;
            const unsigned peers = __match_any_sync(0xffffffffu, e);
            const int rank = __popc(peers & below);
            const int start = on ? cursor[e] : 0;
            __syncwarp();
            if (on && pass == 1) order[start + rank] = p;
            // The group's highest lane advances the expert's cursor past the group.
            if (on && (peers >> lane) == 1u) cursor[e] = start + rank + 1;
            __syncwarp();
        }
        if (pass == 0 && lane == 0) {  // counts -> offsets, and cursors at each expert's start
            int sum = 0;
            for (int e = 0; e < n_expert; ++e) {
                const int c = cursor[e];
                offsets[e] = sum;
                cursor[e] = sum;
                sum += c;
            }
            offsets[n_expert] = sum;
        }
        __syncwarp();
    }
}

}  // namespace

void group_by_expert(const int32_t *ids, int n_pairs, int n_expert, int32_t *offsets,
                     int32_t *order, cudaStream_t stream) {
    if (n_expert <= 0 || n_expert > kMaxExperts || n_pairs < 0)
        throw ds4::Error("group_by_expert: 1 to 1024 experts");
    launch_kernel(group_kernel, 1, 32, 0, stream, ids, n_pairs, n_expert, offsets, order);
    DS4_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ds4::cuda

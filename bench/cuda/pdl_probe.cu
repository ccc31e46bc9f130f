// Does programmatic dependent launch overlap two kernels on this device, launched on a stream
// and replayed from a captured graph, and how long is the gap between two dependent kernels
// without it? Kernel A spins for ~20 us, then records its end time; kernel B records the time
// its blocks started (before griddepcontrol.wait) and the time the wait returned. With PDL and
// A admitting its dependents early (griddepcontrol.launch_dependents after its own wait), B
// starts before A ends; otherwise it starts after. Prints the offsets (B start - A end, B wait
// - A end) in microseconds per mode and the captured edge's type (1: programmatic); a
// diagnostic, not a test. docs/PERFORMANCE.md (CUDA, 2026-12-04) has its output on the H200.
//   build/bin/pdl_probe   (built with the CUDA target)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "probe_check.h"

__device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void kernel_a(unsigned long long *times, bool admit_early) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (admit_early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const unsigned long long t0 = now_ns();
    while (now_ns() - t0 < 20000) {
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) times[0] = now_ns();
}

__global__ void kernel_b(unsigned long long *times) {
    const unsigned long long start = now_ns();
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        times[1] = start;
        times[2] = now_ns();
    }
}

void launch_pair(cudaStream_t s, unsigned long long *times, bool pdl, bool admit_early) {
    kernel_a<<<8, 128, 0, s>>>(times, admit_early);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = 8;
    config.blockDim = 128;
    config.stream = s;
    config.attrs = attr;
    config.numAttrs = pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&config, kernel_b, times));
}

void report(const char *mode, unsigned long long *times) {
    unsigned long long h[3];
    CHECK(cudaMemcpy(h, times, sizeof h, cudaMemcpyDeviceToHost));
    std::printf("%-34s B start - A end %+8.2f us, B wait - A end %+8.2f us\n", mode,
                (double(h[1]) - double(h[0])) / 1000.0, (double(h[2]) - double(h[0])) / 1000.0);
}

int main() {
    unsigned long long *times = nullptr;
    CHECK(cudaMalloc(&times, 3 * sizeof(unsigned long long)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int pdl = 0; pdl < 2; ++pdl)
        for (int early = 0; early < 2; ++early) {
            char mode[64];
            for (int rep = 0; rep < 3; ++rep) {  // the last of three (the first warms up)
                launch_pair(s, times, pdl, early);
                CHECK(cudaStreamSynchronize(s));
            }
            std::snprintf(mode, sizeof mode, "stream, pdl %d, admit early %d", pdl, early);
            report(mode, times);
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            launch_pair(s, times, pdl, early);
            CHECK(cudaStreamEndCapture(s, &graph));
            size_t edges = 0;
            CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
            cudaGraphNode_t from[4], to[4];
            cudaGraphEdgeData data[4];
            CHECK(cudaGraphGetEdges(graph, from, to, data, &edges));
            CHECK(cudaGraphInstantiate(&exec, graph, 0));
            for (int rep = 0; rep < 3; ++rep) {
                CHECK(cudaGraphLaunch(exec, s));
                CHECK(cudaStreamSynchronize(s));
            }
            std::snprintf(mode, sizeof mode, "graph (edge type %d), pdl %d, early %d",
                          edges ? int(data[0].type) : -1, pdl, early);
            report(mode, times);
            CHECK(cudaGraphExecDestroy(exec));
            CHECK(cudaGraphDestroy(graph));
        }
    return 0;
}

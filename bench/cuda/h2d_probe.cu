// How fast do host-to-device copies of expert-sized pieces run, by where the host bytes are and
// by how many streams issue them? The device tier of CUDA streaming (runtime/cuda/
// device_expert_tier.cpp) copies a missed expert's three parts (2.2-2.8 MB each in the Flash
// layout) from the host tier; with the mapped host tier those bytes are a tmpfs file's pages,
// registered with cudaHostRegister. Sources: pinned (cudaMallocHost), and a MAP_SHARED mapping
// of a file under the given directory (tmpfs: /dev/shm) registered read-only, as the mapped tier
// does. Each row copies 512 MiB in pieces of the given size, from scattered offsets, round-robin
// over K streams (each its own device buffer), timed by events; prints GB/s. A diagnostic, not
// a test; docs/SSD_STREAMING.md has its output on the H200.
//   build/bin/h2d_probe [DIR]   (DIR: /dev/shm by default; a 2 GiB file is written there)
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "probe_check.h"

namespace {

constexpr size_t kSource = size_t(2) << 30, kTotal = size_t(512) << 20;

// GB/s of kTotal bytes in pieces of `piece` bytes from src over n_streams (<= 4) streams.
double copy_rate(const unsigned char *src, size_t piece, int n_streams) {
    cudaStream_t streams[4];
    void *dst[4];
    for (int i = 0; i < n_streams; ++i) {
        CHECK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
        CHECK(cudaMalloc(&dst[i], piece));
    }
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    const size_t n = kTotal / piece, slots = kSource / piece;
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaEventRecord(start, streams[0]));
        for (int i = 1; i < n_streams; ++i) CHECK(cudaStreamWaitEvent(streams[i], start));
        for (size_t k = 0; k < n; ++k) {
            const size_t at = (k * 7919 + size_t(rep) * 31) % slots * piece;  // scattered
            const int s = int(k % size_t(n_streams));
            CHECK(cudaMemcpyAsync(dst[s], src + at, piece, cudaMemcpyHostToDevice, streams[s]));
        }
        for (int i = 1; i < n_streams; ++i) {
            cudaEvent_t done;
            CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
            CHECK(cudaEventRecord(done, streams[i]));
            CHECK(cudaStreamWaitEvent(streams[0], done));
            CHECK(cudaEventDestroy(done));
        }
        CHECK(cudaEventRecord(stop, streams[0]));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        const double rate = double(n * piece) / (double(ms) * 1e6);
        if (rate > best) best = rate;
    }
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    for (int i = 0; i < n_streams; ++i) {
        CHECK(cudaStreamDestroy(streams[i]));
        CHECK(cudaFree(dst[i]));
    }
    return best;
}

void table(const char *name, const unsigned char *src) {
    for (size_t piece : {size_t(256) << 10, size_t(2200) << 10, size_t(7) << 20, size_t(32) << 20})
        for (int k : {1, 2, 4})
            std::printf("%-28s %8.2f MB %2d stream%s %8.2f GB/s\n", name, double(piece) / 1e6, k,
                        k == 1 ? " " : "s", copy_rate(src, piece, k));
}

}  // namespace

int main(int argc, char **argv) {
    const std::string dir = argc > 1 ? argv[1] : "/dev/shm";
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d async copy engines\n", prop.name, prop.asyncEngineCount);

    unsigned char *pinned = nullptr;
    CHECK(cudaMallocHost(&pinned, kSource));
    std::memset(pinned, 1, kSource);
    table("pinned (cudaMallocHost)", pinned);
    CHECK(cudaFreeHost(pinned));

    const std::string path = dir + "/h2d_probe.bin";
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, off_t(kSource)) != 0) {
        std::perror(path.c_str());
        return 1;
    }
    void *w = mmap(nullptr, kSource, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (w == MAP_FAILED) {
        std::perror("mmap");
        return 1;
    }
    std::memset(w, 2, kSource);  // the file's pages exist before they are mapped read-only
    munmap(w, kSource);
    void *r = mmap(nullptr, kSource, PROT_READ, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED) {
        std::perror("mmap");
        return 1;
    }
    CHECK(cudaHostRegister(r, kSource, cudaHostRegisterReadOnly));
    table("registered tmpfs mapping", static_cast<const unsigned char *>(r));
    CHECK(cudaHostUnregister(r));
    munmap(r, kSource);
    close(fd);
    unlink(path.c_str());
    return 0;
}

// bench_disk_read: the raw read bandwidth of the disk under a file, to set beside what SSD
// streaming achieves (docs/SSD_STREAMING.md). O_DIRECT reads of --block bytes (default 7 MiB, one
// q2 expert rounded up) from --threads threads at once (the queue depth), for --seconds or until
// --bytes are read: `seq` walks the file in order (each thread takes the next block), `rand`
// reads blocks at random 4 KiB-aligned offsets (fixed seed). `mapped` is the other bound, the
// read of a model already in memory (page cache, tmpfs) through its mapping, as the resident
// engine reads it: the first --bytes of the file mapped, summed in order by the threads once to
// map the pages, then again, timed (the CPU decode roofline: these bytes / a token's weights).
// One line per mode:
//   rand qd 8 block 7340032: 3.21 GiB/s (12.84 GiB in 4.00 s)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Args {
    std::string path, mode = "rand";
    uint64_t block = 7ull << 20, max_bytes = 8ull << 30;
    int threads = 8;
    double seconds = 5;
};

int usage() {
    std::fprintf(
        stderr,
        "usage: bench_disk_read FILE [--mode seq|rand|mapped] [--threads N] [--block BYTES] "
        "[--seconds S] [--bytes N]\n");
    return 2;
}

// --mode mapped: prints the GB/s (1e9 bytes) of the timed pass; 1 if the file cannot be mapped.
int mapped_read(const Args &a) {
    const int fd = ::open(a.path.c_str(), O_RDONLY);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
        std::fprintf(stderr, "bench_disk_read: %s: %s\n", a.path.c_str(), std::strerror(errno));
        if (fd >= 0) ::close(fd);
        return 1;
    }
    const uint64_t bytes =
        std::min<uint64_t>(uint64_t(st.st_size), a.max_bytes) / a.block * a.block;
    if (bytes == 0) {
        std::fprintf(stderr, "bench_disk_read: %s is smaller than one block (%llu bytes)\n",
                     a.path.c_str(), (unsigned long long)a.block);
        ::close(fd);
        return 1;
    }
    void *map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) {
        std::fprintf(stderr, "bench_disk_read: cannot map %s\n", a.path.c_str());
        return 1;
    }
    const auto *words = static_cast<const uint64_t *>(map);
    std::atomic<uint64_t> sink{0};
    auto pass = [&] {
        std::atomic<uint64_t> next_block{0};
        std::vector<std::thread> pool;
        for (int t = 0; t < a.threads; ++t)
            pool.emplace_back([&] {
                uint64_t sum = 0;
                for (uint64_t b; (b = next_block++) < bytes / a.block;) {
                    const uint64_t *w = words + b * (a.block / 8);
                    for (uint64_t i = 0; i < a.block / 8; ++i) sum += w[i];
                }
                sink += sum;
            });
        for (auto &th : pool) th.join();
    };
    pass();
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ::munmap(map, bytes);
    std::printf("mapped threads %d block %llu: %.1f GB/s (%.2f GB in %.3f s; sum %llx)\n",
                a.threads, (unsigned long long)a.block, double(bytes) / s / 1e9,
                double(bytes) / 1e9, s, (unsigned long long)sink.load());
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        auto next = [&]() -> const char * { return i + 1 < argc ? argv[++i] : nullptr; };
        const char *v = nullptr;
        if (k == "--mode" && (v = next()))
            a.mode = v;
        else if (k == "--threads" && (v = next()))
            a.threads = std::atoi(v);
        else if (k == "--block" && (v = next()))
            a.block = std::strtoull(v, nullptr, 10);
        else if (k == "--seconds" && (v = next()))
            a.seconds = std::atof(v);
        else if (k == "--bytes" && (v = next()))
            a.max_bytes = std::strtoull(v, nullptr, 10);
        else if (k[0] != '-' && a.path.empty())
            a.path = k;
        else
            return usage();
    }
    if (a.path.empty() || a.threads < 1 || a.block < 4096 ||
        (a.mode != "seq" && a.mode != "rand" && a.mode != "mapped"))
        return usage();
    a.block = a.block / 4096 * 4096;
    if (a.mode == "mapped") return mapped_read(a);
    const int fd = ::open(a.path.c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) {
        std::fprintf(stderr, "bench_disk_read: %s: %s\n", a.path.c_str(), std::strerror(errno));
        return 1;
    }
    struct stat st {};
    ::fstat(fd, &st);
    const uint64_t blocks = uint64_t(st.st_size) / a.block;
    if (blocks < 2) {
        std::fprintf(stderr, "bench_disk_read: %s is too small\n", a.path.c_str());
        return 1;
    }
    std::atomic<uint64_t> next_block{0}, total{0};
    std::atomic<bool> failed{false};
    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    std::vector<std::thread> pool;
    for (int t = 0; t < a.threads; ++t)
        pool.emplace_back([&, t] {
            void *buf = nullptr;
            if (::posix_memalign(&buf, 4096, a.block) != 0) return;
            std::mt19937_64 rng(1234 + t);
            while (!failed && total < a.max_bytes && elapsed() < a.seconds) {
                uint64_t off;
                if (a.mode == "seq") {
                    const uint64_t b = next_block++;
                    if (b >= blocks) break;
                    off = b * a.block;
                } else {
                    off = (rng() % ((uint64_t(st.st_size) - a.block) / 4096)) * 4096;
                }
                const ssize_t r = ::pread(fd, buf, a.block, off_t(off));
                if (r <= 0) {
                    failed = true;
                    break;
                }
                total += uint64_t(r);
            }
            std::free(buf);
        });
    for (auto &th : pool) th.join();
    const double s = elapsed();
    ::close(fd);
    if (failed) {
        std::fprintf(stderr, "bench_disk_read: a read failed\n");
        return 1;
    }
    const double gib = double(total) / (1024.0 * 1024 * 1024);
    std::printf("%s qd %d block %llu: %.2f GiB/s (%.2f GiB in %.2f s)\n", a.mode.c_str(), a.threads,
                (unsigned long long)a.block, gib / s, gib, s);
    return 0;
}

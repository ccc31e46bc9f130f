// Matrix-vector throughput against the machine's streaming-read bandwidth.
//
// Decode at batch 1 reads every weight byte once per token, so a matvec is good when it moves
// weight bytes as fast as a plain sum over a buffer moves bytes. Both are measured here with the
// same thread pool and buffers far larger than the caches:
//
//   read_bandwidth/T     sum of a 1 GiB buffer as u64, T threads           -> GB/s
//                        (T: 1 and 2, and for read_bandwidth and matvec the counts that
//                        DS4_BENCH_THREADS lists, e.g. "8 16" on a bigger machine)
//   matvec/TYPE/T        y = W x, W >= 512 MiB of TYPE, rows of K = 4096    -> GB/s of weight
//                        bytes; each call is followed by a plain read of the same bytes with
//                        the same pool (read_GB/s), and x_read = read time / matvec time
//   matvec_cached/TYPE   the same on a 512 KiB matrix (L2), 1 thread: the kernel's ceiling
//   matvec_expert/TYPE/N/K/T  decode-sized matrices (a routed expert's gate or down, an
//                        attention projection), a different one each call from a 256 MiB slab:
//                        the fixed cost per call (activation quantization, dispatch) shows;
//                        paired with a read of another matrix of the same size
//   matmul/TYPE/m        Y = X W^T, 64 MiB of weights, m activation rows, 2 threads -> weight
//                        GB/s (bytes of W per call / time) and GFLOP/s (2 n k m per call)
//   fork_join/T          a parallel_for whose T chunks meet at a barrier: the time for every
//                        worker to start on a job and the caller to see it finished
//   fork_join_asleep/T   the same after the workers fell asleep (1 ms idle)
//   parallel_for_empty/T a job of 1000 one-task chunks that do nothing: the claim cost
//
// Values of the weights do not change the speed (random valid blocks, repeated). GB is 1e9
// bytes. cpu_share (CPU time of the process / wall time / threads) flags runs disturbed by
// other processes: trust a number only where it is close to 1. docs/PERFORMANCE.md has the
// method and the numbers.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/thread_pool.h"
#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace {

using ds4::GgmlType;
using ds4::backend::cpu::ScratchBuffer;
using ds4::backend::cpu::ThreadPool;
using Clock = std::chrono::steady_clock;

constexpr int64_t kK = 4096;  // the model's hidden size
constexpr size_t kMatvecBytes = size_t{512} << 20;
constexpr size_t kReadBytes = size_t{1} << 30;
constexpr size_t kMatmulBytes = size_t{64} << 20;
constexpr size_t kCachedBytes = size_t{512} << 10;
constexpr size_t kExpertSlabBytes = size_t{256} << 20;
constexpr size_t kReadChunk = size_t{1} << 20;  // the largest matvec chunk (matmul.cpp)

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,    GgmlType::Q8_0,
                              GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::IQ2_XXS, GgmlType::MXFP4};

// CPU seconds used by all threads of the process. Over a timed loop, divided by wall time and
// thread count, it gives cpu_share: about 1 when every pool thread had a core to itself (a
// spinning worker counts as running), about 0.5 when another process took one of two cores.
// Numbers with cpu_share well below 1 were measured on a busy machine.
double process_cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Wall and CPU time of a timed loop.
class LoopTimer {
  public:
    LoopTimer() : wall0_(Clock::now()), cpu0_(process_cpu_seconds()) {}
    double wall_seconds() const {
        return std::chrono::duration<double>(Clock::now() - wall0_).count();
    }
    double cpu_share(int n_threads) const {
        return (process_cpu_seconds() - cpu0_) / (wall_seconds() * n_threads);
    }

  private:
    Clock::time_point wall0_;
    double cpu0_;
};

ThreadPool &pool_of(int n_threads) {
    static std::map<int, std::unique_ptr<ThreadPool>> pools;
    auto &pool = pools[n_threads];
    if (!pool) pool = std::make_unique<ThreadPool>(n_threads);
    return *pool;
}

// A 2 MiB aligned buffer with transparent huge pages requested (madvise mode is the common
// default), touched once so that page faults stay out of the timings.
class BigBuffer {
  public:
    explicit BigBuffer(size_t bytes) : bytes_(bytes) {
        constexpr size_t kHuge = size_t{2} << 20;
        const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
        data_ = static_cast<uint8_t *>(std::aligned_alloc(kHuge, rounded));
        if (data_ == nullptr) throw std::bad_alloc();
        madvise(data_, rounded, MADV_HUGEPAGE);
        std::memset(data_, 0, rounded);
    }
    ~BigBuffer() { std::free(data_); }
    BigBuffer(const BigBuffer &) = delete;
    BigBuffer &operator=(const BigBuffer &) = delete;
    uint8_t *data() const { return data_; }
    size_t size() const { return bytes_; }

  private:
    uint8_t *data_;
    size_t bytes_;
};

// Rows of K values of `type`, `bytes` or a little more in total: 4 MiB of random valid rows,
// repeated.
struct Weights {
    GgmlType type;
    int64_t n_rows;
    size_t row_bytes;
    std::unique_ptr<BigBuffer> buffer;
};

Weights make_weights(GgmlType type, size_t bytes) {
    const size_t row_bytes = ds4::quant::row_size(type, kK);
    const int64_t n_rows = static_cast<int64_t>((bytes + row_bytes - 1) / row_bytes);
    const int64_t pattern_rows = std::min<int64_t>(n_rows, (4 << 20) / row_bytes);
    const std::vector<uint8_t> pattern = ds4::quant::random_blocks(type, pattern_rows * kK, 42);
    auto buffer = std::make_unique<BigBuffer>(n_rows * row_bytes);
    for (int64_t r = 0; r < n_rows; r += pattern_rows) {
        const int64_t rows = std::min(pattern_rows, n_rows - r);
        std::memcpy(buffer->data() + r * row_bytes, pattern.data(), rows * row_bytes);
    }
    return {type, n_rows, row_bytes, std::move(buffer)};
}

// One large matrix at a time: the previous format is freed before the next is built.
const Weights &weights_of(GgmlType type, size_t bytes) {
    static Weights current{GgmlType::F32, 0, 0, nullptr};
    if (!current.buffer || current.type != type || current.buffer->size() < bytes ||
        current.buffer->size() > bytes + current.row_bytes) {
        current.buffer.reset();
        current = make_weights(type, bytes);
    }
    return current;
}

std::vector<float> random_floats(int64_t n, uint64_t seed) {
    std::vector<float> v(static_cast<size_t>(n));
    ds4::quant::fill_random_blocks(GgmlType::F32, v.data(), n, seed, 1.0f);
    return v;
}

// Sum of n bytes (n a multiple of 128) as u64 lanes, four independent accumulators.
__attribute__((target("avx2"))) uint64_t sum_u64_avx2(const uint8_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i)));
        a1 =
            _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i + 32)));
        a2 =
            _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i + 64)));
        a3 =
            _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i + 96)));
    }
    const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    alignas(32) uint64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i *>(lanes), s);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t sum_u64(const uint8_t *p, size_t n) {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) return sum_u64_avx2(p, n);
    uint64_t s[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i += 32)
        for (int l = 0; l < 4; ++l) {
            uint64_t v;
            std::memcpy(&v, p + i + 8 * l, 8);
            s[l] += v;
        }
    return s[0] + s[1] + s[2] + s[3];
}

// One pass over `bytes` bytes (a multiple of 128), in 1 MiB chunks claimed like matvec's row
// chunks.
void read_pass(ThreadPool &pool, const uint8_t *data, size_t bytes) {
    std::atomic<uint64_t> total{0};
    const int64_t n_chunks = static_cast<int64_t>((bytes + kReadChunk - 1) / kReadChunk);
    pool.parallel_for(n_chunks, 1, [&](int64_t begin, int64_t end, int) {
        uint64_t s = 0;
        for (int64_t c = begin; c < end; ++c) {
            const size_t offset = static_cast<size_t>(c) * kReadChunk;
            s += sum_u64(data + offset, std::min(kReadChunk, bytes - offset));
        }
        total.fetch_add(s, std::memory_order_relaxed);
    });
    benchmark::DoNotOptimize(total.load());
}

size_t readable_bytes(size_t bytes) {
    return bytes / 128 * 128;
}

void BM_read_bandwidth(benchmark::State &state) {
    const int n_threads = static_cast<int>(state.range(0));
    const BigBuffer buf(kReadBytes);
    ThreadPool &pool = pool_of(n_threads);
    read_pass(pool, buf.data(), buf.size());
    int64_t passes = 0;
    const LoopTimer timer;
    for (auto _ : state) {
        read_pass(pool, buf.data(), buf.size());
        ++passes;
    }
    state.counters["GB/s"] = passes * static_cast<double>(buf.size()) / timer.wall_seconds() / 1e9;
    state.counters["cpu_share"] = timer.cpu_share(n_threads);
}

// The bandwidth of the machine drifts with the load of other tenants of the host, so every
// matvec is paired with a plain read of the same number of bytes, right after it and through
// the same pool: x_read = read time / matvec time, both summed over the run. Only the matvec
// time is reported as the benchmark's time.
class PairedTimes {
  public:
    template <class Fn>
    void time_matvec(benchmark::State &state, Fn &&fn) {
        const auto t0 = Clock::now();
        fn();
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        state.SetIterationTime(s);
        matvec_s_ += s;
    }
    void time_read(ThreadPool &pool, const uint8_t *data, size_t bytes) {
        const auto t0 = Clock::now();
        read_pass(pool, data, readable_bytes(bytes));
        read_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    void report(benchmark::State &state, double bytes_per_call, const LoopTimer &timer,
                int n_threads) const {
        const double calls = static_cast<double>(state.iterations());
        state.counters["GB/s"] = calls * bytes_per_call / matvec_s_ / 1e9;
        state.counters["read_GB/s"] = calls * bytes_per_call / read_s_ / 1e9;
        state.counters["x_read"] = read_s_ / matvec_s_;
        state.counters["cpu_share"] = timer.cpu_share(n_threads);
    }

  private:
    double matvec_s_ = 0, read_s_ = 0;
};

void BM_matvec(benchmark::State &state, GgmlType type) {
    const int n_threads = static_cast<int>(state.range(0));
    const Weights &w = weights_of(type, kMatvecBytes);
    const size_t bytes = static_cast<size_t>(w.n_rows) * w.row_bytes;
    ThreadPool &pool = pool_of(n_threads);
    ScratchBuffer scratch;
    const auto x = random_floats(kK, 1);
    std::vector<float> y(static_cast<size_t>(w.n_rows));
    const auto matrix = ds4::backend::cpu::dense_matrix(type, w.buffer->data(), w.n_rows, kK);
    ds4::backend::cpu::matvec(pool, scratch, matrix, x.data(), y.data());
    PairedTimes times;
    const LoopTimer timer;
    for (auto _ : state) {
        times.time_matvec(state, [&] {
            ds4::backend::cpu::matvec(pool, scratch, matrix, x.data(), y.data());
            benchmark::ClobberMemory();
        });
        times.time_read(pool, w.buffer->data(), bytes);  // the same bytes, read plainly
    }
    times.report(state, static_cast<double>(bytes), timer, n_threads);
    state.counters["MiB"] = static_cast<double>(bytes) / (1 << 20);
}

void BM_matvec_cached(benchmark::State &state, GgmlType type) {
    const Weights w = make_weights(type, kCachedBytes);
    ThreadPool &pool = pool_of(1);
    ScratchBuffer scratch;
    const auto x = random_floats(kK, 1);
    std::vector<float> y(static_cast<size_t>(w.n_rows));
    const auto matrix = ds4::backend::cpu::dense_matrix(type, w.buffer->data(), w.n_rows, kK);
    for (auto _ : state) {
        ds4::backend::cpu::matvec(pool, scratch, matrix, x.data(), y.data());
        benchmark::ClobberMemory();
    }
    state.counters["GB/s"] = benchmark::Counter(static_cast<double>(w.n_rows * w.row_bytes) / 1e9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void BM_matvec_expert(benchmark::State &state, GgmlType type) {
    const int64_t n_rows = state.range(0), k = state.range(1);
    const int n_threads = static_cast<int>(state.range(2));
    const size_t matrix_bytes = ds4::quant::row_size(type, k) * n_rows;
    const int64_t n_matrices = static_cast<int64_t>(kExpertSlabBytes / matrix_bytes);
    // Rows of K = 4096 or 2048 both tile the slab: reuse the 4096-wide buffer as raw bytes.
    const Weights &slab = weights_of(type, n_matrices * matrix_bytes);
    ThreadPool &pool = pool_of(n_threads);
    ScratchBuffer scratch;
    const auto x = random_floats(k, 3);
    std::vector<float> y(static_cast<size_t>(n_rows));
    PairedTimes times;
    const LoopTimer timer;
    int64_t calls = 0;
    for (auto _ : state) {
        const int64_t e = calls++ % n_matrices;
        const auto matrix =
            ds4::backend::cpu::expert_matrix(type, slab.buffer->data(), n_rows, k, e);
        times.time_matvec(state, [&] {
            ds4::backend::cpu::matvec(pool, scratch, matrix, x.data(), y.data());
            benchmark::ClobberMemory();
        });
        // A plain read of another matrix of the slab, not touched for a while (not cached).
        const int64_t other = (e + n_matrices / 2) % n_matrices;
        times.time_read(pool, slab.buffer->data() + other * matrix_bytes, matrix_bytes);
    }
    times.report(state, static_cast<double>(matrix_bytes), timer, n_threads);
}

void BM_matmul(benchmark::State &state, GgmlType type) {
    const int64_t m = state.range(0);
    const int n_threads = static_cast<int>(state.range(1));
    const Weights &w = weights_of(type, kMatmulBytes);
    ThreadPool &pool = pool_of(n_threads);
    ScratchBuffer scratch;
    const auto X = random_floats(m * kK, 2);
    std::vector<float> Y(static_cast<size_t>(m * w.n_rows));
    const auto matrix = ds4::backend::cpu::dense_matrix(type, w.buffer->data(), w.n_rows, kK);
    ds4::backend::cpu::matmul(pool, scratch, matrix, X.data(), m, Y.data());
    const LoopTimer timer;
    for (auto _ : state) {
        ds4::backend::cpu::matmul(pool, scratch, matrix, X.data(), m, Y.data());
        benchmark::ClobberMemory();
    }
    state.counters["cpu_share"] = timer.cpu_share(n_threads);
    using benchmark::Counter;
    state.counters["GB/s"] = Counter(static_cast<double>(w.n_rows * w.row_bytes) / 1e9,
                                     Counter::kIsIterationInvariantRate);
    state.counters["GFLOP/s"] =
        Counter(2.0 * static_cast<double>(w.n_rows) * kK * static_cast<double>(m) / 1e9,
                Counter::kIsIterationInvariantRate);
}

// Every thread that runs a chunk checks in, and no chunk ends before all have: the call
// returns once all workers have started on the job and the caller has seen them finish.
void fork_join(ThreadPool &pool) {
    const int n = pool.n_threads();
    std::atomic<int> arrived{0};
    pool.parallel_for(n, 1, [&](int64_t, int64_t, int) {
        arrived.fetch_add(1, std::memory_order_acq_rel);
        while (arrived.load(std::memory_order_acquire) < n) {
        }
    });
}

// Per-call times, to report the median and the 90th percentile next to the mean: on a shared
// machine a few calls wait a whole scheduler time slice for a core and dominate the mean.
class CallTimes {
  public:
    void add(double seconds) { times_.push_back(seconds); }
    void report(benchmark::State &state) {
        if (times_.empty()) return;
        std::sort(times_.begin(), times_.end());
        state.counters["median_us"] = 1e6 * times_[times_.size() / 2];
        state.counters["p90_us"] = 1e6 * times_[times_.size() * 9 / 10];
    }

  private:
    std::vector<double> times_;
};

void BM_fork_join(benchmark::State &state) {
    ThreadPool &pool = pool_of(static_cast<int>(state.range(0)));
    CallTimes times;
    const LoopTimer timer;
    for (auto _ : state) {
        const auto t0 = Clock::now();
        fork_join(pool);
        times.add(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    state.counters["cpu_share"] = timer.cpu_share(pool.n_threads());
    times.report(state);
}

void BM_fork_join_asleep(benchmark::State &state) {
    ThreadPool &pool = pool_of(static_cast<int>(state.range(0)));
    CallTimes times;
    for (auto _ : state) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // past the spin: asleep
        const auto t0 = Clock::now();
        fork_join(pool);
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        state.SetIterationTime(s);
        times.add(s);
    }
    times.report(state);
}

void BM_parallel_for_empty(benchmark::State &state) {
    ThreadPool &pool = pool_of(static_cast<int>(state.range(0)));
    for (auto _ : state)
        pool.parallel_for(1000, 1, [](int64_t b, int64_t, int) { benchmark::DoNotOptimize(b); });
}

// The thread counts of read_bandwidth and matvec: 1 and 2, and those DS4_BENCH_THREADS lists
// ("8 16": a bigger machine's scaling).
std::vector<int64_t> thread_counts() {
    std::vector<int64_t> counts = {1, 2};
    if (const char *v = std::getenv("DS4_BENCH_THREADS")) {
        std::istringstream in(v);
        for (int64_t t; in >> t;)
            if (t > 2 && t <= 1024) counts.push_back(t);
    }
    return counts;
}

void register_all() {
    using benchmark::RegisterBenchmark;
    const auto ms = benchmark::kMillisecond;
    auto *read = RegisterBenchmark("read_bandwidth", BM_read_bandwidth);
    for (int64_t t : thread_counts()) read->Arg(t);
    read->Unit(ms)->UseRealTime();
    for (GgmlType t : kAllTypes) {
        const std::string name(ds4::ggml_type_name(t));
        auto *b = RegisterBenchmark(("matvec/" + name).c_str(), BM_matvec, t);
        for (int64_t n : thread_counts()) b->Arg(n);
        b->Unit(ms)->UseManualTime();
    }
    for (GgmlType t : kAllTypes) {
        const std::string name(ds4::ggml_type_name(t));
        RegisterBenchmark(("matvec_cached/" + name).c_str(), BM_matvec_cached, t)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
    }
    struct ExpertShape {
        GgmlType type;
        int64_t n_rows, k;
    };
    // q2 experts: IQ2_XXS gate/up (2048 x 4096), Q2_K down (4096 x 2048); q4: Q4_K; Q8_0 as
    // an attention projection (1024 x 4096, q_a-sized).
    for (const ExpertShape e :
         {ExpertShape{GgmlType::IQ2_XXS, 2048, 4096}, ExpertShape{GgmlType::Q2_K, 4096, 2048},
          ExpertShape{GgmlType::Q4_K, 2048, 4096}, ExpertShape{GgmlType::Q8_0, 1024, 4096}}) {
        const std::string name(ds4::ggml_type_name(e.type));
        RegisterBenchmark(("matvec_expert/" + name).c_str(), BM_matvec_expert, e.type)
            ->ArgNames({"n", "k", "threads"})
            ->Args({e.n_rows, e.k, 1})
            ->Args({e.n_rows, e.k, 2})
            ->Unit(benchmark::kMicrosecond)
            ->UseManualTime();
    }
    for (GgmlType t : kAllTypes) {
        const std::string name(ds4::ggml_type_name(t));
        RegisterBenchmark(("matmul/" + name).c_str(), BM_matmul, t)
            ->ArgNames({"m", "threads"})
            ->ArgsProduct({{1, 4, 16, 64}, {2}})
            ->Unit(ms)
            ->UseRealTime();
    }
    RegisterBenchmark("fork_join", BM_fork_join)->Arg(1)->Arg(2)->UseRealTime();
    RegisterBenchmark("fork_join_asleep", BM_fork_join_asleep)->Arg(2)->UseManualTime();
    RegisterBenchmark("parallel_for_empty", BM_parallel_for_empty)->Arg(1)->Arg(2)->UseRealTime();
}

}  // namespace

int main(int argc, char **argv) {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::AddCustomContext("ds4_simd",
                                ds4::quant::simd_level_name(ds4::quant::detected_simd_level()));
    register_all();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}

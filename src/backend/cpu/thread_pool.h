#pragma once
// A persistent pool of threads for data-parallel loops over independent tasks.
//
// Decode calls parallel_for thousands of times per token, so a dispatch must cost a microsecond
// or so: idle workers poll for a new job for a short while (the next dispatch usually comes
// soon) and only then sleep in the kernel (futex). The caller is thread 0 and works too; a loop
// with one chunk runs inline without waking anybody. The caller waits only for workers that
// took part, so a worker that the OS has descheduled (a busy or oversubscribed machine) delays
// nothing: its share is claimed by the others.
//
// Not here: nested or concurrent parallel_for calls on one pool (they throw), thread pinning,
// work priorities.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace ds4::backend::cpu {

struct ThreadPoolOptions {
    int n_threads = 0;  // threads including the caller; 0 = std::thread::hardware_concurrency()
    std::chrono::microseconds spin{100};  // how long an idle thread polls before it sleeps
};

class ThreadPool {
  public:
    explicit ThreadPool(int n_threads = 0);
    explicit ThreadPool(const ThreadPoolOptions &options);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int n_threads() const { return n_threads_; }

    // Runs fn(begin, end, thread_id) over disjoint ranges whose union is [0, n_tasks), then
    // returns. Ranges are chunks of `grain` tasks (the last one shorter), or with grain = 0 one
    // even share per thread. Threads claim chunks in order from a shared counter, so a late or
    // slow thread gets fewer chunks. thread_id is in [0, n_threads()); two calls with the same
    // thread_id never overlap, so per-thread scratch indexed by it is safe. The first exception
    // thrown by fn stops the remaining chunks and is rethrown here.
    template <class Fn>
    void parallel_for(int64_t n_tasks, int64_t grain, Fn &&fn) {
        using FnType = std::remove_reference_t<Fn>;
        ChunkFn call = [](void *ctx, int64_t begin, int64_t end, int thread_id) {
            (*static_cast<FnType *>(ctx))(begin, end, thread_id);
        };
        run(n_tasks, grain, call, const_cast<void *>(static_cast<const void *>(&fn)));
    }
    template <class Fn>
    void parallel_for(int64_t n_tasks, Fn &&fn) {
        parallel_for(n_tasks, 0, std::forward<Fn>(fn));
    }

  private:
    using ChunkFn = void (*)(void *ctx, int64_t begin, int64_t end, int thread_id);

    void run(int64_t n_tasks, int64_t grain, ChunkFn fn, void *ctx);
    void run_chunks(int thread_id);
    void worker_loop(int thread_id);
    void record_exception();
    void wake_workers();
    void wait_for_joined_workers();

    const int n_threads_;
    const std::chrono::microseconds spin_;
    const bool oversubscribed_;  // more threads than cores: spinning yields the core

    // The current job, written by the caller before it opens the job and read only by workers
    // that joined it (see worker_loop).
    ChunkFn job_fn_ = nullptr;
    void *job_ctx_ = nullptr;
    int64_t job_n_tasks_ = 0;
    int64_t job_grain_ = 0;  // tasks per chunk, or 0 for job_n_chunks_ even shares
    int64_t job_n_chunks_ = 0;
    uint64_t last_job_id_ = 0;

    alignas(64) std::atomic<int64_t> next_chunk_{0};
    // Id of the job workers may join, 0 while none is open. A worker joins by incrementing
    // joined_workers_ and then seeing the id still open; the caller closes the job after its own
    // chunks and waits only for workers that joined, never for one that has not woken yet.
    alignas(64) std::atomic<uint64_t> open_job_{0};
    std::atomic<uint32_t> wake_generation_{0};  // futex word of sleeping workers; bumped per job
    std::atomic<uint32_t> sleeping_workers_{0};
    alignas(64) std::atomic<uint32_t> joined_workers_{0};  // futex word of a sleeping caller
    std::atomic<uint32_t> caller_sleeping_{0};
    alignas(64) std::atomic<bool> busy_{false};
    std::atomic<bool> stopping_{false};

    std::mutex exception_mutex_;
    std::exception_ptr exception_;

    std::vector<std::thread> workers_;
};

}  // namespace ds4::backend::cpu

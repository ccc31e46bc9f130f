#include "backend/cpu/thread_pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "common/error.h"

namespace ds4::backend::cpu {
namespace {

// Sleeping and waking use the futex directly on the 32-bit atomics, so a waker can skip the
// system call when it knows nobody sleeps (the *_sleeping counters below).
void futex_wait(std::atomic<uint32_t> &word, uint32_t expected) {
    static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr,
            nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t> &word) {
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
            nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// Polls until done() holds or `spin` has passed; true if done() held. The clock is read only
// every 64 polls: a poll costs a few nanoseconds, a clock read tens. An oversubscribed pool
// yields instead of pausing, so that the thread it waits for can have the core.
template <class Done>
bool spin_until(Done done, std::chrono::microseconds spin, bool yield) {
    if (done()) return true;
    if (spin.count() <= 0) return false;
    const auto deadline = std::chrono::steady_clock::now() + spin;
    for (;;) {
        for (int i = 0; i < 64; ++i) {
            if (yield)
                sched_yield();
            else
                cpu_relax();
            if (done()) return true;
        }
        if (std::chrono::steady_clock::now() >= deadline) return false;
    }
}

int resolve_thread_count(int requested) {
    if (requested < 0)
        throw Error("ThreadPool: thread count must be >= 0 (0 = all cores), got " +
                    std::to_string(requested));
    if (requested > 0) return requested;
    return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : ThreadPool(ThreadPoolOptions{n_threads}) {}

ThreadPool::ThreadPool(const ThreadPoolOptions &options)
    : n_threads_(resolve_thread_count(options.n_threads)),
      spin_(options.spin),
      oversubscribed_(n_threads_ > static_cast<int>(std::thread::hardware_concurrency())) {
    workers_.reserve(n_threads_ - 1);
    try {
        for (int id = 1; id < n_threads_; ++id) {
            workers_.emplace_back([this, id] { worker_loop(id); });
            const std::string name = "ds4-cpu-" + std::to_string(id);
            pthread_setname_np(workers_.back().native_handle(), name.substr(0, 15).c_str());
        }
    } catch (...) {
        stopping_.store(true);
        wake_workers();
        for (auto &w : workers_) w.join();
        throw;
    }
}

ThreadPool::~ThreadPool() {
    stopping_.store(true);
    wake_workers();
    for (auto &w : workers_) w.join();
}

void ThreadPool::wake_workers() {
    // seq_cst pairs with the worker's sleeping_workers_ increment: either we see the sleeper and
    // wake it, or it sees the new generation and does not sleep.
    wake_generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(wake_generation_);
}

void ThreadPool::run(int64_t n_tasks, int64_t grain, ChunkFn fn, void *ctx) {
    if (n_tasks < 0 || grain < 0)
        throw Error("ThreadPool::parallel_for: negative task count (" + std::to_string(n_tasks) +
                    ") or grain (" + std::to_string(grain) + ")");
    if (n_tasks == 0) return;
    if (busy_.exchange(true, std::memory_order_acquire))
        throw Error("ThreadPool::parallel_for: nested or concurrent call on the same pool");
    struct ClearBusy {
        std::atomic<bool> &busy;
        ~ClearBusy() { busy.store(false, std::memory_order_release); }
    } clear_busy{busy_};

    job_fn_ = fn;
    job_ctx_ = ctx;
    job_n_tasks_ = n_tasks;
    job_grain_ = grain;
    job_n_chunks_ =
        grain == 0 ? std::min<int64_t>(n_threads_, n_tasks) : (n_tasks + grain - 1) / grain;
    next_chunk_.store(0, std::memory_order_relaxed);

    if (job_n_chunks_ == 1 || n_threads_ == 1) {  // nothing to share: no wake-up, no hand-off
        run_chunks(0);
    } else {
        open_job_.store(++last_job_id_, std::memory_order_seq_cst);
        wake_workers();
        run_chunks(0);
        // Every chunk is claimed now. Close the job so that no late worker joins it, and wait
        // for those that did to finish their chunks.
        open_job_.store(0, std::memory_order_seq_cst);
        wait_for_joined_workers();
    }

    if (exception_) {
        std::exception_ptr e = std::exchange(exception_, nullptr);
        std::rethrow_exception(e);
    }
}

void ThreadPool::wait_for_joined_workers() {
    auto none_left = [this] { return joined_workers_.load(std::memory_order_seq_cst) == 0; };
    if (spin_until(none_left, spin_, oversubscribed_)) return;
    // seq_cst pairs with the leaving worker's decrement and its caller_sleeping_ load.
    caller_sleeping_.store(1, std::memory_order_seq_cst);
    for (uint32_t left; (left = joined_workers_.load(std::memory_order_seq_cst)) != 0;)
        futex_wait(joined_workers_, left);
    caller_sleeping_.store(0, std::memory_order_relaxed);
}

void ThreadPool::run_chunks(int thread_id) {
    for (;;) {
        const int64_t chunk = next_chunk_.fetch_add(1, std::memory_order_relaxed);
        if (chunk >= job_n_chunks_) return;
        int64_t begin, end;
        if (job_grain_ == 0) {  // even shares: chunk c is [c n / C, (c + 1) n / C)
            begin = chunk * job_n_tasks_ / job_n_chunks_;
            end = (chunk + 1) * job_n_tasks_ / job_n_chunks_;
        } else {
            begin = chunk * job_grain_;
            end = std::min(job_n_tasks_, begin + job_grain_);
        }
        try {
            job_fn_(job_ctx_, begin, end, thread_id);
        } catch (...) {
            record_exception();
            next_chunk_.store(job_n_chunks_, std::memory_order_relaxed);  // hand out no more
            return;
        }
    }
}

void ThreadPool::record_exception() {
    std::lock_guard lock(exception_mutex_);
    if (!exception_) exception_ = std::current_exception();
}

void ThreadPool::worker_loop(int thread_id) {
    uint64_t done_job = 0;  // the last job this worker joined; it never joins one twice
    for (;;) {
        // Wait for an open job we have not done yet (or for shutdown). The generation is read
        // before the job id, so a job opened after that read also changes the futex word and
        // the sleep below returns at once.
        uint32_t generation = wake_generation_.load(std::memory_order_seq_cst);
        auto has_work = [&] {
            const uint64_t job = open_job_.load(std::memory_order_seq_cst);
            return (job != 0 && job != done_job) || stopping_.load(std::memory_order_relaxed);
        };
        if (!spin_until(has_work, spin_, oversubscribed_)) {
            sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
            while (!has_work()) {
                futex_wait(wake_generation_, generation);
                generation = wake_generation_.load(std::memory_order_seq_cst);
            }
            sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
        }
        if (stopping_.load(std::memory_order_acquire)) return;

        // Join: announce ourselves, then check the job is still open. The caller closes it and
        // then reads joined_workers_, so it either waits for us or we see it closed.
        const uint64_t job = open_job_.load(std::memory_order_seq_cst);
        if (job == 0 || job == done_job) continue;
        joined_workers_.fetch_add(1, std::memory_order_seq_cst);
        if (open_job_.load(std::memory_order_seq_cst) == job) {
            run_chunks(thread_id);
            done_job = job;
        }
        if (joined_workers_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
            caller_sleeping_.load(std::memory_order_seq_cst) != 0)
            futex_wake_all(joined_workers_);
    }
}

}  // namespace ds4::backend::cpu

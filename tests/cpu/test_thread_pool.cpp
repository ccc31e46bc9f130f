// ThreadPool: every task runs exactly once, thread ids are exclusive, errors come back to the
// caller, and the spin / sleep / wake paths neither lose a dispatch nor hang at shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "common/error.h"

namespace ds4::backend::cpu {
namespace {

using namespace std::chrono_literals;

constexpr int kThreadCounts[] = {1, 2, 3, 5};

// Runs one parallel_for and checks the contract on what fn saw.
void check_coverage(ThreadPool &pool, int64_t n_tasks, int64_t grain) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n_tasks));
    std::vector<std::atomic<int>> in_use(static_cast<size_t>(pool.n_threads()));
    std::atomic<int> bad_range{0}, bad_thread{0}, overlap{0};
    pool.parallel_for(n_tasks, grain, [&](int64_t begin, int64_t end, int thread_id) {
        if (thread_id < 0 || thread_id >= pool.n_threads()) {
            ++bad_thread;
            return;
        }
        if (in_use[thread_id].exchange(1) != 0) ++overlap;
        if (begin < 0 || end > n_tasks || begin >= end) ++bad_range;
        if (grain > 0 && end - begin > grain) ++bad_range;
        for (int64_t t = std::max<int64_t>(begin, 0); t < std::min(end, n_tasks); ++t) ++hits[t];
        in_use[thread_id].store(0);
    });
    EXPECT_EQ(bad_thread.load(), 0);
    EXPECT_EQ(bad_range.load(), 0);
    EXPECT_EQ(overlap.load(), 0);
    for (int64_t t = 0; t < n_tasks; ++t)
        ASSERT_EQ(hits[t].load(), 1) << "task " << t << " of " << n_tasks << ", grain " << grain
                                     << ", threads " << pool.n_threads();
}

TEST(ThreadPool, EveryTaskRunsExactlyOnce) {
    for (int threads : kThreadCounts) {
        ThreadPool pool(threads);
        EXPECT_EQ(pool.n_threads(), threads);
        for (int64_t n_tasks : {0, 1, 2, 3, 7, 64, 1001})
            for (int64_t grain : {0, 1, 3, 64, 5000}) check_coverage(pool, n_tasks, grain);
    }
}

TEST(ThreadPool, EvenSharesAreContiguousAndBalanced) {
    // grain = 0: one range per thread, sizes differing by at most one task.
    ThreadPool pool(3);
    std::vector<std::pair<int64_t, int64_t>> ranges(3, {-1, -1});
    std::atomic<int> calls{0};
    pool.parallel_for(10, [&](int64_t begin, int64_t end, int) {
        ranges[calls++] = {begin, end};  // at most 3 calls: one per share
    });
    ASSERT_EQ(calls.load(), 3);
    std::set<std::pair<int64_t, int64_t>> got(ranges.begin(), ranges.end());
    EXPECT_EQ(got, (std::set<std::pair<int64_t, int64_t>>{{0, 3}, {3, 6}, {6, 10}}));
}

TEST(ThreadPool, DefaultUsesAllCores) {
    ThreadPool pool;
    EXPECT_EQ(pool.n_threads(),
              static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    EXPECT_THROW(ThreadPool(-1), ds4::Error);
}

TEST(ThreadPool, WorkersShareTheWork) {
    // Chunks that sleep leave the cores free, so the worker gets scheduled and must take some.
    ThreadPool pool(2);
    std::atomic<int> by_worker{0};
    pool.parallel_for(40, 1, [&](int64_t, int64_t, int thread_id) {
        if (thread_id != 0) ++by_worker;
        std::this_thread::sleep_for(1ms);
    });
    EXPECT_GT(by_worker.load(), 0);
}

TEST(ThreadPool, ExceptionReachesTheCallerAndPoolStaysUsable) {
    for (int threads : kThreadCounts) {
        ThreadPool pool(threads);
        EXPECT_THROW(pool.parallel_for(100, 1,
                                       [](int64_t begin, int64_t, int) {
                                           if (begin == 37) throw std::runtime_error("task 37");
                                       }),
                     std::runtime_error);
        check_coverage(pool, 100, 1);
    }
}

TEST(ThreadPool, NestedCallThrows) {
    ThreadPool pool(2);
    EXPECT_THROW(pool.parallel_for(4, 1,
                                   [&](int64_t, int64_t, int) {
                                       pool.parallel_for(2, 1, [](int64_t, int64_t, int) {});
                                   }),
                 ds4::Error);
    check_coverage(pool, 100, 1);
    EXPECT_THROW(pool.parallel_for(-1, [](int64_t, int64_t, int) {}), ds4::Error);
    EXPECT_THROW(pool.parallel_for(5, -2, [](int64_t, int64_t, int) {}), ds4::Error);
}

// Many short dispatches in a row: a lost wake-up or a miscounted completion hangs or miscounts.
// Every 10th dispatch sleeps in one chunk, which leaves a core to the workers even on a busy
// machine, so they join some of the jobs (WorkersShareTheWork asserts that they do).
void run_many(ThreadPool &pool, int n_dispatches) {
    std::atomic<int64_t> sum{0}, by_workers{0};
    for (int i = 0; i < n_dispatches; ++i)
        pool.parallel_for(8, 1, [&](int64_t begin, int64_t end, int thread_id) {
            if (begin == 0 && i % 10 == 0) std::this_thread::sleep_for(50us);
            for (int64_t t = begin; t < end; ++t) sum += t;
            if (thread_id != 0) ++by_workers;
        });
    EXPECT_EQ(sum.load(), int64_t{n_dispatches} * 28);
    ::testing::Test::RecordProperty("chunks_run_by_workers_" + std::to_string(pool.n_threads()),
                                    std::to_string(by_workers.load()));
}

TEST(ThreadPool, ManyDispatchesWhileSpinning) {
    for (int threads : kThreadCounts) {
        ThreadPool pool(ThreadPoolOptions{threads, 1000us});
        run_many(pool, 1000);
    }
}

TEST(ThreadPool, ManyDispatchesThroughSleepAndWake) {
    // No spinning: every wait goes through the futex, for the workers and for the caller.
    for (int threads : kThreadCounts) {
        ThreadPool pool(ThreadPoolOptions{threads, 0us});
        run_many(pool, 300);
    }
}

TEST(ThreadPool, WakesWorkersThatFellAsleep) {
    ThreadPool pool(ThreadPoolOptions{3, 50us});
    for (int i = 0; i < 10; ++i) {
        std::this_thread::sleep_for(2ms);  // longer than the spin: the workers sleep
        check_coverage(pool, 50, 1);
    }
}

TEST(ThreadPool, ShutsDownCleanly) {
    // Right after start (workers may not have run yet), while spinning, and while asleep.
    for (int i = 0; i < 50; ++i) ThreadPool pool(5);
    {
        ThreadPool pool(ThreadPoolOptions{3, 10000us});
        check_coverage(pool, 10, 1);
    }
    {
        ThreadPool pool(ThreadPoolOptions{3, 0us});
        check_coverage(pool, 10, 1);
        std::this_thread::sleep_for(2ms);
    }
}

}  // namespace
}  // namespace ds4::backend::cpu

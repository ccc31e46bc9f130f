// The portable reader: a few threads, each taking one raw read at a time from a queue and doing it
// with pread, so that several reads are in flight at once on any kernel (and under seccomp
// profiles that forbid io_uring).
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "experts/expert_reader.h"

namespace ds4::experts {
namespace {

class PoolReader : public ExpertReader {
  public:
    PoolReader(int fd, uint32_t n_threads, uint32_t max_in_flight)
        : ExpertReader(fd, max_in_flight) {
        if (n_threads == 0) n_threads = 1;
        for (uint32_t i = 0; i < n_threads; ++i) threads_.emplace_back([this] { work(); });
    }

    ~PoolReader() override {
        drain();
        {
            std::lock_guard lk(queue_m_);
            stop_ = true;
        }
        queue_cv_.notify_all();
        for (auto &t : threads_) t.join();
    }

    const char *name() const override { return "pread pool"; }

  protected:
    void start(uint64_t ticket, uint64_t offset, uint64_t length, uint8_t *dst) override {
        {
            std::lock_guard lk(queue_m_);
            jobs_.push_back({ticket, offset, length, dst});
        }
        queue_cv_.notify_one();
    }

  private:
    struct Job {
        uint64_t ticket, offset, length;
        uint8_t *dst;
    };

    void work() {
        for (;;) {
            Job j;
            {
                std::unique_lock lk(queue_m_);
                queue_cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
                if (jobs_.empty()) return;
                j = jobs_.front();
                jobs_.pop_front();
            }
            const ssize_t n = ::pread(fd_, j.dst, j.length, static_cast<off_t>(j.offset));
            complete(j.ticket, n >= 0 ? static_cast<int64_t>(n) : -static_cast<int64_t>(errno));
        }
    }

    std::mutex queue_m_;
    std::condition_variable queue_cv_;
    std::deque<Job> jobs_;
    bool stop_ = false;
    std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<ExpertReader> make_pool_reader(int fd, uint32_t n_threads, uint32_t max_in_flight) {
    return std::make_unique<PoolReader>(fd, n_threads, max_in_flight);
}

}  // namespace ds4::experts

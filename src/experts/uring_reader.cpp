// The io_uring reader: the consumer's thread queues each raw read on a ring and one reaper thread
// collects completions, so a layer's reads are in flight together with no thread per read. Built
// only when liburing was found (DS4_HAVE_LIBURING); make_uring_reader says why it is unusable
// otherwise, and make_reader then falls back to the pread pool.
#include <cstring>
#include <string>

#include "experts/expert_reader.h"

#ifdef DS4_HAVE_LIBURING
#include <liburing.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>
#endif

namespace ds4::experts {

#ifdef DS4_HAVE_LIBURING
namespace {

// One SQE reads at most this much (the opcode's length is 32 bits); the base class continues.
constexpr uint64_t kMaxRawRead = uint64_t(1) << 30;
// A wait that fails for another reason than its timeout is retried after this pause, not spun.
constexpr std::chrono::milliseconds kErrorPause{1};
// A submit the kernel refuses for now is retried after this pause.
constexpr std::chrono::microseconds kRetryPause{50};

class UringReader : public ExpertReader {
  public:
    UringReader(int fd, uint32_t max_in_flight) : ExpertReader(fd, max_in_flight) {}

    // Sets the ring up; "" on success, else the reason.
    std::string init(uint32_t entries) {
        const int rc = io_uring_queue_init(entries, &ring_, 0);
        if (rc < 0) return std::string("io_uring_queue_init: ") + std::strerror(-rc);
        ring_ok_ = true;
        io_uring_probe *probe = io_uring_get_probe_ring(&ring_);
        const bool has_read = probe && io_uring_opcode_supported(probe, IORING_OP_READ);
        if (probe) io_uring_free_probe(probe);
        if (!has_read) return "the kernel's io_uring has no READ opcode";
        // The reaper waits with a timeout; without EXT_ARG liburing would queue a timeout SQE from
        // the reaper's thread, racing the consumer's submissions.
        if (!(ring_.features & IORING_FEAT_EXT_ARG))
            return "the kernel's io_uring lacks IORING_FEAT_EXT_ARG (Linux 5.11)";
        reaper_ = std::thread([this] { reap(); });
        return "";
    }

    ~UringReader() override {
        if (reaper_.joinable()) {
            drain();
            stop_ = true;
            reaper_.join();
        }
        if (ring_ok_) io_uring_queue_exit(&ring_);
    }

    const char *name() const override { return "io_uring"; }

  protected:
    void start(uint64_t ticket, uint64_t offset, uint64_t length, uint8_t *dst) override {
        int err = 0;
        {
            std::unique_lock lk(sq_m_);
            io_uring_sqe *sqe = dead_ ? nullptr : io_uring_get_sqe(&ring_);
            if (!sqe) {
                // Cannot happen while each ticket has at most one raw read queued and the ring
                // holds max_in_flight entries; fail the read rather than wait forever.
                err = dead_ ? EIO : EBUSY;
            } else {
                io_uring_prep_read(sqe, fd_, dst,
                                   static_cast<unsigned>(std::min(length, kMaxRawRead)), offset);
                io_uring_sqe_set_data64(sqe, ticket);
                err = submit(lk);
            }
        }
        if (err) complete(ticket, -err);
    }

  private:
    // Transient refusals (the kernel is short of resources until completions are reaped) are
    // retried with the lock released, so that the reaper, which may need it to continue a short
    // read, keeps reaping; the queued SQE goes with whichever submit comes next. Anything else
    // retires the ring.
    int submit(std::unique_lock<std::mutex> &lk) {
        for (;;) {
            const int rc = io_uring_submit(&ring_);
            if (rc >= 0) return 0;
            if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) {
                lk.unlock();
                std::this_thread::sleep_for(kRetryPause);
                lk.lock();
                continue;
            }
            dead_ = true;
            return -rc;
        }
    }

    void reap() {
        __kernel_timespec ts{0, 50 * 1000 * 1000};  // wake to see stop_
        for (;;) {
            io_uring_cqe *cqe = nullptr;
            const int rc = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
            if (rc < 0 || !cqe) {
                if (stop_) return;
                if (rc != -ETIME && rc != -EINTR) std::this_thread::sleep_for(kErrorPause);
                continue;
            }
            const uint64_t ticket = io_uring_cqe_get_data64(cqe);
            const int res = cqe->res;
            io_uring_cqe_seen(&ring_, cqe);
            complete(ticket, res);
        }
    }

    io_uring ring_{};
    bool ring_ok_ = false;
    bool dead_ = false;
    std::mutex sq_m_;
    std::atomic<bool> stop_{false};
    std::thread reaper_;
};

}  // namespace

std::unique_ptr<ExpertReader> make_uring_reader(int fd, uint32_t max_in_flight, std::string *why) {
    if (max_in_flight == 0) max_in_flight = 1;
    auto r = std::make_unique<UringReader>(fd, max_in_flight);
    if (std::string err = r->init(max_in_flight); !err.empty()) {
        if (why) *why = err;
        return nullptr;
    }
    return r;
}

bool uring_compiled() {
    return true;
}

#else

std::unique_ptr<ExpertReader> make_uring_reader(int, uint32_t, std::string *why) {
    if (why) *why = "built without liburing";
    return nullptr;
}

bool uring_compiled() {
    return false;
}

#endif

}  // namespace ds4::experts

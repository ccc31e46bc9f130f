#include "experts/expert_reader.h"

#include <cerrno>

#include "common/error.h"

namespace ds4::experts {

namespace {
// EINTR / EAGAIN restart a raw read; a bound keeps a device that keeps answering so from hanging
// the caller.
constexpr uint32_t kMaxRetries = 1000;
}  // namespace

ExpertReader::ExpertReader(int fd, uint32_t max_in_flight)
    : fd_(fd), max_in_flight_(max_in_flight == 0 ? 1 : max_in_flight) {}

ExpertReader::~ExpertReader() = default;

uint64_t ExpertReader::submit(uint64_t offset, uint64_t length, uint64_t need, uint8_t *dst) {
    if (need > length) throw Error("expert reader: need > length");
    uint64_t ticket;
    {
        std::unique_lock lk(m_);
        cv_.wait(lk, [&] { return in_flight_ < max_in_flight_; });
        ticket = next_ticket_++;
        Op &op = ops_[ticket];
        op.offset = offset;
        op.length = length;
        op.need = need;
        op.dst = dst;
        if (in_flight_++ == 0) busy_since_ = std::chrono::steady_clock::now();
        if (need == 0) {
            finish_locked(op);
            return ticket;
        }
    }
    start(ticket, offset, length, dst);
    return ticket;
}

ReadResult ExpertReader::wait(uint64_t ticket) {
    std::unique_lock lk(m_);
    auto it = ops_.find(ticket);
    if (it == ops_.end()) throw Error("expert reader: wait on an unknown ticket");
    // Inserting other tickets may rehash the table: that keeps references, not iterators.
    const Op &op = it->second;
    cv_.wait(lk, [&] { return op.finished; });
    const ReadResult r{op.done, op.error};
    ops_.erase(ticket);
    return r;
}

void ExpertReader::complete(uint64_t ticket, int64_t result) {
    uint64_t offset, length;
    uint8_t *dst;
    {
        std::lock_guard lk(m_);
        auto it = ops_.find(ticket);
        if (it == ops_.end() || it->second.finished) return;  // not ours, or already failed
        Op &op = it->second;
        if ((result == -EINTR || result == -EAGAIN) && op.retries < kMaxRetries) {
            ++op.retries;
        } else if (result < 0) {
            op.error = static_cast<int>(-result);
            finish_locked(op);
            return;
        } else if (result == 0) {  // end of file before `need` bytes
            finish_locked(op);
            return;
        } else {
            op.done += static_cast<uint64_t>(result);
            bytes_ += static_cast<uint64_t>(result);
            if (op.done >= op.need) {
                finish_locked(op);
                return;
            }
        }
        // A short read: continue where it stopped (the raw start runs outside the lock since an
        // implementation may complete inline).
        offset = op.offset + op.done;
        length = op.length - op.done;
        dst = op.dst + op.done;
    }
    start(ticket, offset, length, dst);
}

void ExpertReader::finish_locked(Op &op) {
    op.finished = true;
    if (--in_flight_ == 0)
        busy_ns_ += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::steady_clock::now() - busy_since_)
                                              .count());
    cv_.notify_all();
}

void ExpertReader::drain() {
    std::unique_lock lk(m_);
    cv_.wait(lk, [&] { return in_flight_ == 0; });
}

uint64_t ExpertReader::bytes_transferred() const {
    std::lock_guard lk(m_);
    return bytes_;
}

uint64_t ExpertReader::busy_ns() const {
    std::lock_guard lk(m_);
    return busy_ns_;
}

OpenedReader make_reader(int fd, const ReaderOptions &opts) {
    OpenedReader r;
    if (opts.kind != ReaderKind::Pool) {
        std::string why;
        if (opts.simulate_uring_failure)
            why = "io_uring_queue_init: Function not implemented (simulated)";
        else
            r.reader = make_uring_reader(fd, opts.max_in_flight, &why);
        if (r.reader) return r;
        r.notice = "io_uring unavailable (" + why + "): reading with a pool of " +
                   std::to_string(opts.pool_threads) + " pread threads";
    }
    r.reader = make_pool_reader(fd, opts.pool_threads, opts.max_in_flight);
    return r;
}

}  // namespace ds4::experts

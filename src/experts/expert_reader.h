#pragma once
// Reads of file ranges with several in flight at once: submit() starts one, wait() blocks until it
// is done. The base class owns what every implementation shares: the ticket table, the loop that
// completes short reads (a read that returns fewer bytes than asked continues where it stopped;
// end of file or an error ends it, and the caller sees the byte count or the errno), the cap on
// reads in flight, and the I/O accounting. An implementation only starts one raw read and reports
// its result. Implementations: io_uring (liburing), a pread thread pool, and fault_reader.h for
// tests. Callers must wait for every ticket whose buffer they want to reuse.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace ds4::experts {

// Done: bytes >= need and error 0. Ended early: bytes < need, with error 0 at end of file, or the
// errno of the raw read that failed (under O_DIRECT the continuation of a partial block at the end
// of the file is unaligned and fails with EINVAL).
struct ReadResult {
    uint64_t bytes = 0;  // bytes read from the start of the range
    int error = 0;       // errno of the read that failed, 0 when none did
};

class ExpertReader {
  public:
    ExpertReader(int fd, uint32_t max_in_flight);
    virtual ~ExpertReader();
    ExpertReader(const ExpertReader &) = delete;
    ExpertReader &operator=(const ExpertReader &) = delete;

    virtual const char *name() const = 0;

    // Starts reading `length` bytes at `offset` into `dst`; done once `need` bytes have arrived
    // (need <= length: an aligned O_DIRECT superset may run past the end of the file) or the
    // file ends or a read fails. Blocks while max_in_flight reads are outstanding.
    uint64_t submit(uint64_t offset, uint64_t length, uint64_t need, uint8_t *dst);
    uint64_t submit(uint64_t offset, uint64_t length, uint8_t *dst) {
        return submit(offset, length, length, dst);
    }
    // Blocks until the read is done; each ticket is waited once.
    ReadResult wait(uint64_t ticket);

    uint64_t bytes_transferred() const;
    uint64_t busy_ns() const;  // wall time with at least one read outstanding

  protected:
    // One raw read of [offset, offset + length) into dst; the implementation calls complete()
    // with its result (bytes, or -errno), from any thread, possibly before start returns.
    virtual void start(uint64_t ticket, uint64_t offset, uint64_t length, uint8_t *dst) = 0;
    void complete(uint64_t ticket, int64_t result);
    // Blocks until no read is outstanding: derived destructors call it before they stop the
    // threads that complete reads.
    void drain();

    const int fd_;

  private:
    struct Op {
        uint64_t offset = 0, length = 0, need = 0, done = 0;
        uint8_t *dst = nullptr;
        uint32_t retries = 0;
        int error = 0;
        bool finished = false;
    };
    void finish_locked(Op &op);

    const uint32_t max_in_flight_;
    mutable std::mutex m_;
    std::condition_variable cv_;
    std::unordered_map<uint64_t, Op> ops_;
    uint64_t next_ticket_ = 1;
    uint32_t in_flight_ = 0;
    uint64_t bytes_ = 0;
    uint64_t busy_ns_ = 0;
    std::chrono::steady_clock::time_point busy_since_;
};

enum class ReaderKind {
    Auto,     // io_uring when it works here, else the pool (with a notice)
    IoUring,  // io_uring, else the pool (with a notice)
    Pool,     // the pread thread pool
};

struct ReaderOptions {
    ReaderKind kind = ReaderKind::Auto;
    uint32_t pool_threads = 8;            // pread threads (the reference engine uses 8-9)
    uint32_t max_in_flight = 64;          // reads outstanding at once (the io_uring queue depth)
    bool simulate_uring_failure = false;  // tests: io_uring setup fails as under seccomp (ENOSYS)
};

struct OpenedReader {
    std::unique_ptr<ExpertReader> reader;
    std::string notice;  // why the pool replaced io_uring; empty when nothing was replaced
};

// The reader `opts` asks for on `fd` (which must outlive it).
OpenedReader make_reader(int fd, const ReaderOptions &opts);

// Each implementation on its own. make_uring_reader returns null, with the reason in *why, when
// io_uring cannot be used (not compiled in, setup refused, read opcode missing).
std::unique_ptr<ExpertReader> make_pool_reader(int fd, uint32_t n_threads, uint32_t max_in_flight);
std::unique_ptr<ExpertReader> make_uring_reader(int fd, uint32_t max_in_flight, std::string *why);
bool uring_compiled();  // liburing was found when this build was configured

}  // namespace ds4::experts

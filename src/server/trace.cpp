#include "server/trace.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace ds4::server {

TraceFile::TraceFile(const std::string &path, Log log) : path_(path), log_(std::move(log)) {
    // O_NONBLOCK: a FIFO without a reader fails here (ENXIO) instead of blocking the start.
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd_ < 0) throw Error(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
    try {
        repair_tail();
    } catch (...) {
        ::close(fd_);
        throw;
    }
}

TraceFile::~TraceFile() {
    if (fd_ >= 0) ::close(fd_);
}

void TraceFile::repair_tail() {
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return;
    const int rd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (rd < 0) return;  // a write-only file: nothing can be checked
    // The last line: read backwards in blocks to its start.
    const off_t size = st.st_size;
    off_t line_start = 0;
    std::vector<char> block(65536);
    bool terminated = true;
    for (off_t end = size; end > 0;) {
        const off_t begin = end > off_t(block.size()) ? end - off_t(block.size()) : 0;
        const ssize_t n = ::pread(rd, block.data(), size_t(end - begin), begin);
        if (n != end - begin) {
            ::close(rd);
            return;  // unreadable: leave the file as it is
        }
        if (end == size && block[size_t(n - 1)] == '\n') break;
        terminated = false;
        bool found = false;
        for (ssize_t i = n - 1; i >= 0; --i) {
            if (block[size_t(i)] == '\n') {
                line_start = begin + i + 1;
                found = true;
                break;
            }
        }
        if (found) break;
        end = begin;
    }
    if (terminated) {
        ::close(rd);
        return;
    }
    // The unterminated last line is cut only when it is a torn record of a trace file: an
    // earlier first line and this one start as records do, and this one is not whole JSON (a
    // whole record that only lost its newline gets the newline back, as any other file does;
    // so does a file of that one line: nothing shows that it is a trace).
    auto starts_as_record = [&](off_t at) {
        std::string head(kTraceRecordStart.size(), '\0');
        return ::pread(rd, head.data(), head.size(), at) == ssize_t(head.size()) &&
               head == kTraceRecordStart;
    };
    bool torn = line_start > 0 && starts_as_record(line_start) && starts_as_record(0);
    if (torn) {
        std::string tail(size_t(size - line_start), '\0');
        torn = ::pread(rd, tail.data(), tail.size(), line_start) == ssize_t(tail.size()) &&
               !nlohmann::json::accept(tail);
    }
    ::close(rd);
    if (torn) {
        if (::ftruncate(fd_, line_start) != 0)
            throw Error(fmt::format("cannot cut the unfinished record at the end of {}: {}", path_,
                                    std::strerror(errno)));
        if (log_)
            log_(fmt::format("removed an unfinished record of {} bytes at the end of {}",
                             size - line_start, path_));
        return;
    }
    if (::write(fd_, "\n", 1) != 1)
        throw Error(fmt::format("cannot write to {}: {}", path_, std::strerror(errno)));
    if (log_) log_(fmt::format("{} did not end with a newline: one was added", path_));
}

bool TraceFile::write(const nlohmann::ordered_json &record) {
    try {
        std::string line =
            record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
        line += '\n';
        std::lock_guard lock(mu_);
        struct stat st {};
        const bool regular = ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
        // One write; another only when the kernel took part of the line (a signal, a full disk).
        size_t done = 0;
        int err = 0;
        while (done < line.size()) {
            const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                err = n < 0 ? errno : EIO;
                break;
            }
            done += size_t(n);
        }
        if (err == 0) {
            failing_ = false;
            return true;
        }
        // Take back what was written of the line, so that the file keeps only whole records.
        std::string undo;
        if (done > 0 && regular && ::ftruncate(fd_, st.st_size) != 0)
            undo = fmt::format(" (and {} bytes of it stay: {})", done, std::strerror(errno));
        if (!failing_ && log_)
            log_(fmt::format("cannot write a record to {}: {}{}", path_, std::strerror(err), undo));
        failing_ = true;
        return false;
    } catch (const std::exception &e) {
        if (log_) log_(fmt::format("cannot write a record to {}: {}", path_, e.what()));
        return false;
    } catch (...) {
        return false;
    }
}

}  // namespace ds4::server

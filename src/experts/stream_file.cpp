#include "experts/stream_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace ds4::experts {
namespace {

// Some file systems accept O_DIRECT at open and refuse it at the first read (EINVAL): one aligned
// read of the first block tells.
bool direct_read_works(int fd) {
    void *buf =
        ::mmap(nullptr, kDirectAlign, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return false;
    const ssize_t n = ::pread(fd, buf, kDirectAlign, 0);
    ::munmap(buf, kDirectAlign);
    return n >= 0;
}

}  // namespace

StreamFile::StreamFile(const std::string &path, bool want_direct) : path_(path) {
    if (want_direct) {
        fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (fd_ >= 0 && direct_read_works(fd_)) {
            direct_ = true;
            opened_ = stamp();
            return;
        }
        const int err = fd_ < 0 ? errno : EINVAL;
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
        notice_ = path + ": O_DIRECT refused (" + std::strerror(err) +
                  "): expert reads go through the page cache";
    }
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error(path + ": cannot open for SSD streaming: " + std::strerror(errno));
    // Experts are read at scattered offsets; the kernel's sequential read-ahead would only read
    // bytes nobody asked for.
    (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
    opened_ = stamp();
}

StreamFile::~StreamFile() {
    if (fd_ >= 0) ::close(fd_);
}

StreamFile::Stamp StreamFile::stamp() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw Error(path_ + ": fstat: " + std::strerror(errno));
    return {uint64_t(st.st_size), int64_t(st.st_mtim.tv_sec), int64_t(st.st_mtim.tv_nsec)};
}

bool StreamFile::changed() const {
    return stamp() != opened_;
}

uint64_t StreamFile::size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw Error(path_ + ": fstat: " + std::strerror(errno));
    return static_cast<uint64_t>(st.st_size);
}

}  // namespace ds4::experts

#include "input_files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "exit_codes.h"

namespace ds4::tools {

namespace {

// Closes the descriptor on every path out of the readers below.
struct Fd {
    int fd;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace

std::string read_input_file(const std::string &path, const std::string &what) {
    if (path.empty()) throw UsageError(fmt::format("{}: the path is empty", what));
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        throw UsageError(fmt::format("cannot read {} {}: {}", what, path, std::strerror(errno)));
    if (S_ISDIR(st.st_mode))
        throw UsageError(fmt::format("{} {} is a directory, not a file", what, path));
    const Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (f.fd < 0)
        throw UsageError(fmt::format("cannot read {} {}: {}", what, path, std::strerror(errno)));
    // Far more text than the longest context holds (1M tokens are ~4 MiB of text), so that
    // /dev/zero or an endless pipe ends in a message, not in exhausted memory.
    constexpr size_t kMaxBytes = size_t(256) << 20;
    std::string out;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(f.fd, buf, sizeof buf);
        if (n == 0) break;
        if (n > 0 && out.size() + size_t(n) > kMaxBytes)
            throw UsageError(fmt::format("{} {} is larger than {} MiB: not a prompt", what, path,
                                         kMaxBytes >> 20));
        if (n < 0) {
            if (errno == EINTR) continue;
            throw UsageError(
                fmt::format("cannot read {} {}: {}", what, path, std::strerror(errno)));
        }
        out.append(buf, size_t(n));
    }
    return out;
}

void check_output_writable(const std::string &path, const std::string &what) {
    if (path.empty()) throw UsageError(fmt::format("{}: the path is empty", what));
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        throw UsageError(fmt::format("{} {} is a directory, not a file", what, path));
    const bool existed = ::access(path.c_str(), F_OK) == 0;
    const Fd f{::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644)};
    if (f.fd < 0)
        throw UsageError(fmt::format("cannot write {} {}: {}", what, path, std::strerror(errno)));
    if (!existed) ::unlink(path.c_str());
}

}  // namespace ds4::tools

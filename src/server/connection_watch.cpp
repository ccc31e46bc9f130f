#include "server/connection_watch.h"

#ifdef __linux__
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#endif

namespace ds4::server {

#ifdef __linux__
namespace {

// The numeric host and port of an address, as httplib writes them into a Request.
bool same_address(const sockaddr_storage &a, socklen_t len, const std::string &host, int port) {
    char h[NI_MAXHOST], p[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<const sockaddr *>(&a), len, h, sizeof h, p, sizeof p,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return false;
    return host == h && port == std::atoi(p);
}

}  // namespace

ConnectionWatch::ConnectionWatch(const std::string &local_addr, int local_port,
                                 const std::string &remote_addr, int remote_port) {
    if (local_port <= 0 || remote_port <= 0) return;
    DIR *dir = opendir("/proc/self/fd");
    if (!dir) return;
    while (const dirent *e = readdir(dir)) {
        char *end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
        struct stat st;
        if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        sockaddr_storage peer{}, self{};
        socklen_t peer_len = sizeof peer, self_len = sizeof self;
        if (getpeername(int(fd), reinterpret_cast<sockaddr *>(&peer), &peer_len) != 0) continue;
        if (getsockname(int(fd), reinterpret_cast<sockaddr *>(&self), &self_len) != 0) continue;
        if (same_address(peer, peer_len, remote_addr, remote_port) &&
            same_address(self, self_len, local_addr, local_port)) {
            fd_ = int(fd);
            break;
        }
    }
    closedir(dir);
}

bool ConnectionWatch::closed() const {
    if (fd_ < 0) return false;
    pollfd p{.fd = fd_, .events = POLLRDHUP, .revents = 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}
#else
ConnectionWatch::ConnectionWatch(const std::string &, int, const std::string &, int) {}
bool ConnectionWatch::closed() const {
    return false;
}
#endif

}  // namespace ds4::server

#pragma once
// Whether the client of a request has gone away, for requests that write nothing while they wait
// or compute (a queued request, a non-streaming one). cpp-httplib 0.11 gives a handler the
// connection's addresses but not its socket, so the socket is found among the process's open
// descriptors (/proc/self/fd) as the one whose local and peer addresses are the request's;
// closed() then polls it for the peer's FIN (POLLRDHUP) or an error. Linux only: elsewhere, or
// when no descriptor matches, closed() is always false (docs/SERVER.md, Cancellation).
#include <string>

namespace ds4::server {

class ConnectionWatch {
  public:
    ConnectionWatch() = default;
    ConnectionWatch(const std::string &local_addr, int local_port, const std::string &remote_addr,
                    int remote_port);
    bool found() const { return fd_ >= 0; }
    // True once the peer has closed (or shut down its sending side of) the connection.
    bool closed() const;

  private:
    int fd_ = -1;  // owned by httplib, open for as long as the request's handler runs
};

}  // namespace ds4::server

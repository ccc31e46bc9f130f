#include "tool_main.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "exit_codes.h"

namespace ds4::tools {

namespace {

// A message may hold a newline (e.g. from a library); the line stays one line.
void print_line(std::string_view tool, std::string_view what) {
    std::string msg(what);
    for (char &c : msg)
        if (c == '\n' || c == '\r') c = ' ';
    std::fprintf(stderr, "%.*s: %s\n", int(tool.size()), tool.data(), msg.c_str());
}

}  // namespace

int report_current_exception(std::string_view tool) noexcept {
    try {
        throw;
    } catch (const UsageError &e) {
        print_line(tool, e.what());
        return kExitUsage;
    } catch (const std::bad_alloc &) {
        print_line(tool,
                   "out of memory: an allocation failed (lower --ctx or free memory and retry)");
        return kExitFailure;
    } catch (const std::exception &e) {
        print_line(tool, e.what());
        return kExitFailure;
    } catch (...) {
        print_line(tool, "failed with an unknown exception");
        return kExitFailure;
    }
}

int guarded_main(std::string_view tool, const std::function<int()> &body) noexcept {
    // A closed pipe on stdout (`ds4 ... | head -1`) is a failed write, reported below, not a
    // death by SIGPIPE (exit 141, outside the documented codes).
    std::signal(SIGPIPE, SIG_IGN);
    int rc;
    try {
        rc = body();
    } catch (...) {
        rc = report_current_exception(tool);
    }
    // Output that could not be written (a full disk, a closed pipe) is a runtime failure, even
    // when the work itself succeeded.
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
        const int err = errno;
        std::fprintf(stderr, "%.*s: cannot write standard output: %s\n", int(tool.size()),
                     tool.data(), err ? std::strerror(err) : "write error");
        if (rc == kExitOk) rc = kExitFailure;
    }
    return rc;
}

}  // namespace ds4::tools

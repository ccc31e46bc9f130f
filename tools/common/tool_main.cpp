#include "tool_main.h"

#include <cstdio>
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
    try {
        return body();
    } catch (...) {
        return report_current_exception(tool);
    }
}

}  // namespace ds4::tools

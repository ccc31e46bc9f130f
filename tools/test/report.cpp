#include "report.h"

#include <fmt/format.h>

#include <cstdio>

namespace ds4::test {

namespace {

void line(std::string_view tag, std::string_view mode, std::string_view what) {
    fmt::print("{} {}: {}\n", tag, mode, what);
    std::fflush(stdout);
}

}  // namespace

void Report::pass(std::string_view mode, std::string_view what) {
    ++passed_;
    line("PASS", mode, what);
}

void Report::fail(std::string_view mode, std::string_view what) {
    ++failed_;
    line("FAIL", mode, what);
}

void Report::skip(std::string_view mode, std::string_view what) {
    ++skipped_;
    line("SKIP", mode, what);
}

void Report::note(std::string_view mode, std::string_view text) {
    line("#", mode, text);
}

void Report::print_summary() const {
    fmt::print("{} passed, {} failed, {} skipped\n", passed_, failed_, skipped_);
    std::fflush(stdout);
}

}  // namespace ds4::test

#pragma once
// The boundary of every tool's main: whatever the body throws ends as one line on stderr,
// "<tool>: <message>", and an exit code (exit_codes.h), never as std::terminate.
#include <functional>
#include <string_view>

namespace ds4::tools {

// Runs body() and returns its exit code; an exception becomes a message and kExitUsage
// (UsageError) or kExitFailure (anything else; std::bad_alloc says it ran out of memory). SIGPIPE
// is ignored, and stdout that could not be written (full disk, closed pipe) turns success into
// kExitFailure with a message.
int guarded_main(std::string_view tool, const std::function<int()> &body) noexcept;

// The same mapping for an exception in flight, for loops that must survive a failed command
// (the chat's commands): prints the message and returns the exit code it would give.
int report_current_exception(std::string_view tool) noexcept;

}  // namespace ds4::tools

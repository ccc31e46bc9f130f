#pragma once
// The exit codes every command-line tool uses (docs/CLI.md), and the error type that selects
// "bad input" over "runtime failure": a script can tell a wrong argument or file from a run
// that went wrong.
#include <string>

#include "common/error.h"

namespace ds4::tools {

enum ExitCode : int {
    kExitOk = 0,
    kExitFailure = 1,       // the work failed: out of memory, a write failed, a check failed
    kExitUsage = 2,         // bad arguments, environment or input files; nothing was done
    kExitInterrupted = 130  // stopped by Ctrl-C (128 + SIGINT, as shells report it)
};

// Bad arguments, environment variables or input files: the tool exits kExitUsage.
class UsageError : public Error {
  public:
    using Error::Error;
};

// The exit-code table printed at the end of every tool's --help.
std::string exit_code_footer();

}  // namespace ds4::tools

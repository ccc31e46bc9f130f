#pragma once
// What every tool's CLI11 front end shares: --version, the exit-code footer of --help, a parse
// error as one line, and range checks whose errors are words ("must be at least 1") instead of
// CLI11's numeric limits.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ds4::tools {

// Adds --version and the exit-code footer; parse errors print "<tool>: <error> (see --help)".
void configure_app(CLI::App &app, const std::string &tool);

// Parses; returns the exit code when the tool must stop now (--help, --version: 0; an error: 2,
// after printing it), nothing when it should go on. `args` in CLI11's order (reversed).
std::optional<int> parse_args(CLI::App &app, std::vector<std::string> args);
std::optional<int> parse_args(CLI::App &app, int argc, char **argv);

// A whole number in [lo, hi] (digits with an optional sign; no fraction, no exponent).
CLI::Validator integer_in(int64_t lo, int64_t hi);
// A whole number >= lo with no upper limit but the type's (uint64).
CLI::Validator integer_at_least(uint64_t lo);
// A finite number in [lo, hi] (NaN and infinities refused).
CLI::Validator number_in(double lo, double hi);

// An argument as an error message shows it: quoted, at most 40 characters (then "..."), bytes
// outside printable ASCII as '?', so that a huge or binary argument stays one short line.
std::string quoted_arg(const std::string &s);

}  // namespace ds4::tools

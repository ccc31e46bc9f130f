#include "cli_app.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "exit_codes.h"
#include "version.h"

namespace ds4::tools {

namespace {

// The value as given, cut short so that a huge argument does not make a huge error line.
std::string shown(const std::string &s) {
    std::string out;
    for (char c : s.substr(0, 40)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
    return "'" + out + (s.size() > 40 ? "...'" : "'");
}

// Reads an integer of the whole string; nullopt when it is not one, or too large for int64
// (`too_large` set in that case).
template <typename T>
std::optional<T> parse_whole(const std::string &s, bool &too_large) {
    too_large = false;
    T v{};
    const char *b = s.data(), *e = s.data() + s.size();
    if (b != e && *b == '+') ++b;
    const auto [p, ec] = std::from_chars(b, e, v);
    if (ec == std::errc::result_out_of_range && p == e) too_large = true;
    if (ec != std::errc() || p != e || b == e) return std::nullopt;
    return v;
}

}  // namespace

std::string quoted_arg(const std::string &s) {
    return shown(s);
}

void configure_app(CLI::App &app, const std::string &tool) {
    app.set_version_flag("--version", version_string(), "Print the version and exit");
    app.footer(exit_code_footer());
    app.failure_message([tool](const CLI::App *, const CLI::Error &e) {
        std::string msg = e.what();
        for (char &c : msg)
            if (c == '\n') c = ' ';
        return fmt::format("{}: {} (see --help)\n", tool, msg);
    });
}

std::optional<int> parse_args(CLI::App &app, std::vector<std::string> args) {
    try {
        app.parse(args);
    } catch (const CLI::ParseError &e) {
        const int rc = app.exit(e);
        return e.get_exit_code() == 0 ? rc : kExitUsage;
    }
    return std::nullopt;
}

std::optional<int> parse_args(CLI::App &app, int argc, char **argv) {
    std::vector<std::string> args;
    for (int i = argc - 1; i >= 1; --i) args.emplace_back(argv[i]);
    return parse_args(app, std::move(args));
}

CLI::Validator integer_in(int64_t lo, int64_t hi) {
    const std::string range = hi == std::numeric_limits<int64_t>::max()
                                  ? fmt::format("at least {}", lo)
                                  : fmt::format("from {} to {}", lo, hi);
    return CLI::Validator(
        [=](std::string &s) -> std::string {
            bool too_large = false;
            const auto v = parse_whole<int64_t>(s, too_large);
            if (!v)
                return fmt::format("must be a whole number {}, got {}{}", range, shown(s),
                                   too_large ? " (too large)" : "");
            if (*v < lo) return fmt::format("must be at least {}, got {}", lo, *v);
            if (*v > hi) return fmt::format("must be at most {}, got {}", hi, *v);
            return "";
        },
        "INT " + range);
}

CLI::Validator integer_at_least(uint64_t lo) {
    return CLI::Validator(
        [=](std::string &s) -> std::string {
            bool too_large = false;
            const auto v = parse_whole<uint64_t>(s, too_large);
            if (!v)
                return fmt::format("must be a whole number of at least {}, got {}{}", lo, shown(s),
                                   too_large ? " (too large)" : "");
            if (*v < lo) return fmt::format("must be at least {}, got {}", lo, *v);
            return "";
        },
        fmt::format("INT at least {}", lo));
}

CLI::Validator number_in(double lo, double hi) {
    return CLI::Validator(
        [=](std::string &s) -> std::string {
            double v = 0;
            const char *b = s.data(), *e = s.data() + s.size();
            if (b != e && *b == '+') ++b;
            const auto [p, ec] = std::from_chars(b, e, v);
            if (ec != std::errc() || p != e || b == e || !std::isfinite(v))
                return fmt::format("must be a number from {} to {}, got {}", lo, hi, shown(s));
            if (v < lo || v > hi)
                return fmt::format("must be from {} to {}, got {}", lo, hi, shown(s));
            return "";
        },
        fmt::format("NUMBER from {} to {}", lo, hi));
}

}  // namespace ds4::tools

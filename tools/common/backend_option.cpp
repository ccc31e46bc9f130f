#include "backend_option.h"

#include <fmt/format.h>

#include <vector>

#include "cli_app.h"
#include "common/error.h"
#include "exit_codes.h"

namespace ds4::tools {

runtime::Backend BackendFlags::backend() const {
    // Every flag given, as written, with the backend it names.
    std::vector<std::pair<std::string, runtime::Backend>> named;
    if (cpu) named.emplace_back("--cpu", runtime::Backend::Cpu);
    if (cuda) named.emplace_back("--cuda", runtime::Backend::Cuda);
    if (!name.empty()) {
        try {
            named.emplace_back("--backend " + name, runtime::parse_backend(name));
        } catch (const Error &) {  // the parser's check refuses it first; kept for direct use
            throw UsageError(
                fmt::format("--backend: must be cpu or cuda, got {}", quoted_arg(name)));
        }
    }
    for (const auto &[flag, b] : named)
        if (b != named.front().second)
            throw UsageError(fmt::format("{} and {} name different backends; give one",
                                         named.front().first, flag));
    return named.empty() ? runtime::Backend::Cpu : named.front().second;
}

void add_backend_options(CLI::App &app, BackendFlags &flags) {
    app.add_option("--backend", flags.name, "Backend: cpu (the default) or cuda")
        ->check(CLI::Validator(
            [](std::string &s) -> std::string {
                if (s == runtime::backend_name(runtime::Backend::Cpu) ||
                    s == runtime::backend_name(runtime::Backend::Cuda))
                    return "";
                return fmt::format("must be cpu or cuda, got {}", quoted_arg(s));
            },
            "cpu|cuda"));
    app.add_flag("--cuda", flags.cuda,
                 "CUDA backend (= --backend cuda): the weights are copied to the first CUDA "
                 "device; exits 1 when this build has no CUDA backend or no device answers");
    app.add_flag("--cpu", flags.cpu, "CPU backend (= --backend cpu, the default)");
}

}  // namespace ds4::tools

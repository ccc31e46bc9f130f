#include "repo_paths.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#ifndef DS4_INSTALL_DATA_REL
// Relative to the installed binaries' folder; cmake/install.cmake passes the value that matches
// CMAKE_INSTALL_BINDIR and CMAKE_INSTALL_DATADIR.
#define DS4_INSTALL_DATA_REL "../share/ds4cpp"
#endif

namespace ds4::tools {

namespace fs = std::filesystem;

namespace {

bool env_on(const char *name) {
    const char *v = std::getenv(name);
    return v && *v && std::string_view(v) != "0";
}

bool path_exists(const fs::path &p) {
    std::error_code ec;
    return fs::exists(p, ec);
}

fs::path exe_dir() {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (ec || exe.empty()) return {};
    return exe.parent_path();
}

}  // namespace

std::string install_data_dir() {
    const fs::path dir = exe_dir();
    if (dir.empty()) return {};
    return (dir / DS4_INSTALL_DATA_REL).lexically_normal().string();
}

std::vector<RepoPathCandidate> repo_file_candidates(std::string_view rel) {
    const fs::path p(rel);
    std::vector<RepoPathCandidate> out;
    out.push_back({"cwd", p.string(), path_exists(p)});
    if (p.is_absolute()) return out;
    if (const std::string data = install_data_dir(); !data.empty()) {
        const fs::path in_prefix = fs::path(data) / p;
        out.push_back({"install", in_prefix.string(), path_exists(in_prefix)});
    }
    if (!env_on("DS4_NO_SOURCE_FALLBACK")) {
        const fs::path in_source = fs::path(DS4_SOURCE_DIR) / p;
        out.push_back({"source", in_source.string(), path_exists(in_source)});
    }
    return out;
}

std::string find_repo_file(std::string_view rel) {
    const auto candidates = repo_file_candidates(rel);
    const RepoPathCandidate *hit = nullptr;
    for (const auto &c : candidates)
        if (c.exists) {
            hit = &c;
            break;
        }
    const fs::path p(rel);
    // Absolute paths are the user's choice: kept even when missing.
    const std::string chosen = hit ? hit->path : p.string();
    if (env_on("DS4_PRINT_PATHS"))
        std::fprintf(stderr, "ds4: data %s -> %s (%s)\n", std::string(rel).c_str(), chosen.c_str(),
                     hit ? hit->origin.c_str() : "not found");
    return chosen;
}

}  // namespace ds4::tools

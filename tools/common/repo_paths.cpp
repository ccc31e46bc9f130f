#include "repo_paths.h"

#include <filesystem>

namespace ds4::tools {

std::string find_repo_file(std::string_view rel) {
    const std::filesystem::path p(rel);
    if (p.is_absolute() || std::filesystem::exists(p)) return p.string();
    const std::filesystem::path in_source = std::filesystem::path(DS4_SOURCE_DIR) / p;
    if (std::filesystem::exists(in_source)) return in_source.string();
    return p.string();
}

}  // namespace ds4::tools

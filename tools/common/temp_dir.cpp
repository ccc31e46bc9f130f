#include "temp_dir.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/error.h"

namespace ds4::tools {

TempDir::TempDir(const std::string &prefix) {
    const std::string pattern =
        (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data()))
        throw Error(
            fmt::format("cannot create a temporary folder {}: {}", pattern, std::strerror(errno)));
    path_ = buf.data();
}

TempDir::~TempDir() {
    std::error_code ec;  // a destructor must not throw; a leftover temp folder is harmless
    std::filesystem::remove_all(path_, ec);
}

}  // namespace ds4::tools

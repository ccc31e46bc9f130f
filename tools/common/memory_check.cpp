#include "memory_check.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "common/error.h"

namespace ds4::tools {

std::optional<uint64_t> mem_available_bytes(const std::string &meminfo) {
    std::ifstream in(meminfo);
    std::string line;
    while (in && std::getline(in, line)) {
        std::istringstream ls(line);
        std::string key, unit;
        uint64_t kib = 0;
        if (ls >> key >> kib >> unit && key == "MemAvailable:" && unit == "kB") return kib * 1024;
    }
    return std::nullopt;
}

void check_memory_fits(uint64_t need, const std::string &what, const std::string &advice) {
    const auto avail = mem_available_bytes();
    if (!avail || need <= *avail) return;
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    throw Error(fmt::format("{} needs {:.2f} GiB, {:.2f} GiB available ({} bytes; {})", what,
                            need / kGiB, *avail / kGiB, need, advice));
}

}  // namespace ds4::tools

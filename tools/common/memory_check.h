#pragma once
// The memory a request needs, checked against what the machine has before anything is
// allocated: a context too large for the machine is refused with both numbers instead of
// ending in std::bad_alloc (or the OOM killer) half-way through.
#include <cstdint>
#include <optional>
#include <string>

namespace ds4::tools {

// MemAvailable of a /proc/meminfo-format file, in bytes; nothing when it cannot be read.
std::optional<uint64_t> mem_available_bytes(const std::string &meminfo = "/proc/meminfo");

// Throws ds4::Error "<what> needs X GiB, Y GiB available (N bytes; <advice>)" when `need` bytes
// exceed MemAvailable; does nothing when MemAvailable is unknown.
void check_memory_fits(uint64_t need, const std::string &what, const std::string &advice);

}  // namespace ds4::tools

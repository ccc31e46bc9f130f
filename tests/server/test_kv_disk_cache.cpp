// KvDiskCache's start (server/kv_disk_cache.h): the unfinished writes it removes and keeps. A temp
// file named with this process's PID is a previous process's (nothing is written before the
// index), one of another live process is left alone, one of a dead process removed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "server/kv_disk_cache.h"

namespace ds4::server {
namespace {

namespace fs = std::filesystem;

TEST(KvDiskCache, StartRemovesTheTempFilesOfGoneOrEarlierWriters) {
    const fs::path dir =
        fs::temp_directory_path() / ("ds4-kv-cache-test-" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string own = "0000000000000001.kv.tmp." + std::to_string(getpid()) + ".1";
    const std::string parent = "0000000000000002.kv.tmp." + std::to_string(getppid()) + ".1";
    // PIDs above the kernel's pid_max (4194304 at most) belong to no process.
    const std::string gone = "0000000000000003.kv.tmp.999999999.1";
    for (const std::string &n : {own, parent, gone, std::string("notes.txt")})
        std::ofstream(dir / n) << "partial";
    std::vector<std::string> log;
    {
        KvDiskOptions o;
        o.dir = dir.string();
        KvDiskCache cache(o, 42, 4096, [&](const std::string &line) { log.push_back(line); });
        EXPECT_EQ(cache.files(), 0u);
    }
    EXPECT_FALSE(fs::exists(dir / own)) << "a temp file of this PID is a previous run's";
    EXPECT_TRUE(fs::exists(dir / parent)) << "a live process's write is left alone";
    EXPECT_FALSE(fs::exists(dir / gone));
    EXPECT_TRUE(fs::exists(dir / "notes.txt")) << "files that are not checkpoints are not ours";
    fs::remove_all(dir);
}

}  // namespace
}  // namespace ds4::server

// The readers on their own: many reads in flight at once land the file's bytes, short reads are
// continued, end of file and errors are reported (never hidden), and the fallback from io_uring
// to the pool says so. The file content is a counter pattern, so a misplaced byte shows.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "experts/expert_reader.h"
#include "experts/fault_reader.h"
#include "experts/stream_file.h"

using namespace ds4;
using namespace ds4::experts;

namespace {

// 1 MiB + 123 bytes: the tail is not a whole block.
constexpr uint64_t kFileBytes = (1u << 20) + 123;

uint8_t pattern(uint64_t i) {
    return static_cast<uint8_t>((i * 2654435761u) >> 13);
}

// Written once per process, under a name of its own (ctest runs test processes side by side).
const std::string &pattern_file() {
    static const struct File {
        std::string path =
            ::testing::TempDir() + "/" + std::to_string(::getpid()) + "-experts-reader-pattern.bin";
        File() {
            std::vector<uint8_t> b(kFileBytes);
            for (uint64_t i = 0; i < b.size(); ++i) b[i] = pattern(i);
            std::ofstream(path, std::ios::binary)
                .write(reinterpret_cast<const char *>(b.data()), std::streamsize(b.size()));
        }
        ~File() { std::remove(path.c_str()); }
    } file;
    return file.path;
}

// Page-aligned memory for O_DIRECT reads.
struct Aligned {
    explicit Aligned(size_t n) : n(n) {
        p = static_cast<uint8_t *>(
            ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    }
    ~Aligned() { ::munmap(p, n); }
    uint8_t *p;
    size_t n;
};

std::unique_ptr<ExpertReader> reader_of(const std::string &kind, int fd, uint32_t in_flight) {
    if (kind == "pool") return make_pool_reader(fd, 4, in_flight);
    std::string why;
    auto r = make_uring_reader(fd, in_flight, &why);
    return r;
}

class Readers : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
  protected:
    void SetUp() override {
        const auto [kind, direct] = GetParam();
        file_ = std::make_unique<StreamFile>(pattern_file(), direct);
        if (direct && !file_->direct()) GTEST_SKIP() << file_->notice();
        reader_ = reader_of(kind, file_->fd(), 8);
        if (!reader_) GTEST_SKIP() << "io_uring unavailable here";
    }
    std::unique_ptr<StreamFile> file_;
    std::unique_ptr<ExpertReader> reader_;
};

TEST_P(Readers, ManyReadsInFlightLandTheFileBytes) {
    const bool direct = std::get<1>(GetParam());
    std::mt19937_64 rng(5);
    // 200 reads against a cap of 8 in flight: submit blocks and resumes as reads complete.
    constexpr int kReads = 200;
    constexpr uint64_t kMax = 64 * 1024;
    Aligned mem(kReads * (kMax + 2 * kDirectAlign));
    struct R {
        uint64_t off, len, need, ticket;
        uint8_t *dst;
    };
    std::vector<R> rs;
    uint64_t total = 0;
    for (int i = 0; i < kReads; ++i) {
        uint64_t off = rng() % kFileBytes, len = 1 + rng() % kMax;
        uint64_t need = len;
        if (direct) {
            // Aligned superset, possibly past the end of the file (need stops at the end).
            const uint64_t a = off / kDirectAlign * kDirectAlign;
            const uint64_t end = std::min(off + len, kFileBytes);
            need = end - a;
            len = (end + kDirectAlign - 1) / kDirectAlign * kDirectAlign - a;
            off = a;
        } else {
            len = std::min(len, kFileBytes - off);
            need = len;
        }
        uint8_t *dst = mem.p + uint64_t(i) * (kMax + 2 * kDirectAlign);
        std::memset(dst, 0xEE, len);
        rs.push_back({off, len, need, reader_->submit(off, len, need, dst), dst});
    }
    std::shuffle(rs.begin(), rs.end(), rng);  // wait in another order than submitted
    for (const R &r : rs) {
        const ReadResult res = reader_->wait(r.ticket);
        ASSERT_EQ(res.error, 0);
        ASSERT_GE(res.bytes, r.need);
        total += res.bytes;
        for (uint64_t j = 0; j < r.need; ++j)
            ASSERT_EQ(r.dst[j], pattern(r.off + j)) << "read at " << r.off << " byte " << j;
    }
    EXPECT_EQ(reader_->bytes_transferred(), total);
    EXPECT_GT(reader_->busy_ns(), 0u);
}

TEST_P(Readers, EndOfFileIsReportedNotHidden) {
    const bool direct = std::get<1>(GetParam());
    Aligned mem(4 * kDirectAlign);
    const uint64_t off = direct ? kFileBytes / kDirectAlign * kDirectAlign : kFileBytes - 100;
    // Asks for more than the file holds: the byte count says where it ended.
    const ReadResult r = reader_->wait(reader_->submit(off, 2 * kDirectAlign, mem.p));
    EXPECT_EQ(r.bytes, kFileBytes - off);
    // Under O_DIRECT the continuation after the partial last block is unaligned: EINVAL.
    if (direct) {
        EXPECT_TRUE(r.error == 0 || r.error == EINVAL) << r.error;
    } else {
        EXPECT_EQ(r.error, 0);
    }
    for (uint64_t j = 0; j < r.bytes; ++j) ASSERT_EQ(mem.p[j], pattern(off + j));
}

TEST_P(Readers, AReadErrorCarriesItsErrno) {
    Aligned mem(kDirectAlign);
    const std::string kind = std::get<0>(GetParam());
    // A descriptor that is not open: every read fails with EBADF.
    auto bad = reader_of(kind, 1 << 20, 4);
    ASSERT_TRUE(bad);
    const ReadResult r = bad->wait(bad->submit(0, kDirectAlign, mem.p));
    EXPECT_EQ(r.error, EBADF);
    EXPECT_EQ(r.bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    KindsAndDirect, Readers,
    ::testing::Combine(::testing::Values("pool", "io_uring"), ::testing::Bool()),
    [](const auto &info) {
        return std::get<0>(info.param) == "pool"
                   ? std::string(std::get<1>(info.param) ? "PoolDirect" : "PoolBuffered")
                   : std::string(std::get<1>(info.param) ? "UringDirect" : "UringBuffered");
    });

TEST(FaultReader, AShortReadIsContinuedToTheRightBytes) {
    StreamFile f(pattern_file(), false);
    FaultReader r(f.fd(), {.fault = Fault::ShortOnce, .nth = 1});
    std::vector<uint8_t> buf(50000, 0xEE);
    const ReadResult res = r.wait(r.submit(1000, buf.size(), buf.data()));
    EXPECT_TRUE(r.fired());
    EXPECT_EQ(r.raw_reads(), 2u);  // the short read and its continuation
    EXPECT_EQ(res.error, 0);
    ASSERT_EQ(res.bytes, buf.size());
    for (size_t j = 0; j < buf.size(); ++j) ASSERT_EQ(buf[j], pattern(1000 + j)) << j;
}

TEST(FaultReader, AShortReadThenEndOfFileReportsTheShortCount) {
    StreamFile f(pattern_file(), false);
    FaultReader r(f.fd(), {.fault = Fault::ShortThenEof, .nth = 1});
    std::vector<uint8_t> buf(50000);
    const ReadResult res = r.wait(r.submit(0, buf.size(), buf.data()));
    EXPECT_EQ(res.error, 0);
    EXPECT_LT(res.bytes, buf.size());
    EXPECT_GT(res.bytes, 0u);
}

TEST(FaultReader, TheNthReadFailsAndOnlyIt) {
    StreamFile f(pattern_file(), false);
    FaultReader r(f.fd(), {.fault = Fault::ReadError, .nth = 2, .error = EIO});
    std::vector<uint8_t> buf(100);
    EXPECT_EQ(r.wait(r.submit(0, buf.size(), buf.data())).error, 0);
    EXPECT_EQ(r.wait(r.submit(0, buf.size(), buf.data())).error, EIO);
    EXPECT_EQ(r.wait(r.submit(0, buf.size(), buf.data())).error, 0);
}

TEST(MakeReader, AutoPicksIoUringWhereItWorks) {
    StreamFile f(pattern_file(), false);
    const OpenedReader r = make_reader(f.fd(), {});
    ASSERT_TRUE(r.reader);
    if (!uring_compiled()) {
        EXPECT_STREQ(r.reader->name(), "pread pool");
        GTEST_SKIP() << "built without liburing";
    }
    if (!r.notice.empty()) GTEST_SKIP() << r.notice;
    EXPECT_STREQ(r.reader->name(), "io_uring");
}

TEST(MakeReader, IoUringFailureFallsBackToThePoolAndSaysSo) {
    StreamFile f(pattern_file(), false);
    const OpenedReader r =
        make_reader(f.fd(), {.kind = ReaderKind::IoUring, .simulate_uring_failure = true});
    ASSERT_TRUE(r.reader);
    EXPECT_STREQ(r.reader->name(), "pread pool");
    EXPECT_NE(r.notice.find("io_uring unavailable"), std::string::npos) << r.notice;
    std::vector<uint8_t> buf(4096);
    const ReadResult res = r.reader->wait(r.reader->submit(7, buf.size(), buf.data()));
    ASSERT_EQ(res.bytes, buf.size());
    for (size_t j = 0; j < buf.size(); ++j) ASSERT_EQ(buf[j], pattern(7 + j));
}

TEST(MakeReader, ThePoolNeedsNoNotice) {
    StreamFile f(pattern_file(), false);
    const OpenedReader r = make_reader(f.fd(), {.kind = ReaderKind::Pool});
    EXPECT_STREQ(r.reader->name(), "pread pool");
    EXPECT_TRUE(r.notice.empty());
}

TEST(StreamFile, AMissingFileIsAClearError) {
    try {
        StreamFile f(::testing::TempDir() + "/no-such-model.gguf", true);
        FAIL() << "opened a missing file";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("no-such-model.gguf"), std::string::npos) << e.what();
    }
}

}  // namespace

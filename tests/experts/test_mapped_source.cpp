// The mapped host tier (experts/mapped_source.h): every expert's bytes are handed out in place,
// inside the range a device backend registers, and equal what pread of the file at the tensor's
// offset returns (the kernel's read, not the mapping); every get is a hit and a counted selection;
// an unknown layer or expert, and a file whose size changed since it was opened, are ds4::Error.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "experts/mapped_source.h"
#include "stream_test_model.h"

using namespace ds4;
using namespace ds4::experts;
using ds4::test::stream_model;

namespace {

// n bytes of the file at `offset`, read with pread.
std::vector<uint8_t> pread_bytes(const std::string &path, uint64_t offset, uint64_t n) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    EXPECT_GE(fd, 0) << path;
    std::vector<uint8_t> out(n);
    uint64_t got = 0;
    while (fd >= 0 && got < n) {
        const ssize_t r = ::pread(fd, out.data() + got, n - got, off_t(offset + got));
        if (r <= 0) break;
        got += uint64_t(r);
    }
    EXPECT_EQ(got, n);
    if (fd >= 0) ::close(fd);
    return out;
}

TEST(MappedHostSource, EveryExpertIsTheFilesBytesInPlaceInsideTheRegisteredRange) {
    const test::OpenModel &m = stream_model();
    MappedHostSource src(*m.file, m.weights);
    const std::span<uint8_t> range = src.owned_memory();
    const ExpertGeometry g = expert_geometry(m.weights);
    for (uint32_t il = 0; il < m.n_layer(); ++il) {
        const model::LayerWeights &L = m.weights.layers[il];
        const model::Tensor ts[3] = {L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps};
        const uint64_t n[3] = {g.gate, g.up, g.down};
        for (uint32_t e = 0; e < m.n_expert(); ++e) {
            const ExpertBytes b = src.get(il, e);
            const uint8_t *got[3] = {b.gate, b.up, b.down};
            for (int i = 0; i < 3; ++i) {
                ASSERT_GE(got[i], range.data());
                ASSERT_LE(got[i] + n[i], range.data() + range.size());
                // Expert e's slab of a [K, N, n_expert] tensor, at its file offset.
                const uint64_t off = uint64_t(ts[i]->data - m.file->base()) + e * n[i];
                const std::vector<uint8_t> want = pread_bytes(m.file->path(), off, n[i]);
                ASSERT_EQ(std::memcmp(got[i], want.data(), n[i]), 0)
                    << "layer " << il << " expert " << e << " part " << i;
            }
        }
    }
}

TEST(MappedHostSource, TheRangeIsWholePages) {
    const test::OpenModel &m = stream_model();
    MappedHostSource src(*m.file, m.weights);
    const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
    EXPECT_EQ(uintptr_t(src.owned_memory().data()) % page, 0u);
    EXPECT_EQ(src.owned_memory().size() % page, 0u);
    EXPECT_TRUE(src.bytes_stay_valid());
}

TEST(MappedHostSource, EveryGetIsAHitAndACountedSelection) {
    const test::OpenModel &m = stream_model();
    MappedHostSource src(*m.file, m.weights);
    (void)src.get(1, 3);
    (void)src.get(1, 3);
    (void)src.get(0, 0);
    const ExpertStats st = src.stats();
    EXPECT_TRUE(st.streaming);
    EXPECT_EQ(st.entries, uint64_t(m.n_layer()) * m.n_expert());
    EXPECT_EQ(st.gets, 3u);
    EXPECT_EQ(st.hits, 3u);
    EXPECT_EQ(st.misses, 0u);
    EXPECT_EQ(st.bytes_read, 0u);
    EXPECT_EQ(st.expert_bytes, expert_geometry(m.weights).payload());
    const std::vector<uint64_t> c = src.selection_counts();
    ASSERT_EQ(c.size(), size_t(m.n_layer()) * m.n_expert());
    EXPECT_EQ(c[1 * m.n_expert() + 3], 2u);
    EXPECT_EQ(c[0], 1u);
    uint64_t sum = 0;
    for (uint64_t v : c) sum += v;
    EXPECT_EQ(sum, 3u);
}

TEST(MappedHostSource, UnknownLayerOrExpertIsAnError) {
    const test::OpenModel &m = stream_model();
    MappedHostSource src(*m.file, m.weights);
    EXPECT_THROW((void)src.get(m.n_layer(), 0), Error);
    EXPECT_THROW((void)src.get(0, m.n_expert()), Error);
    EXPECT_EQ(src.stats().gets, 0u);
}

TEST(MappedHostSource, AFileThatChangedSizeIsRefused) {
    const test::RemoveOnExit copy{test::write_stream_model("mapped-grown.gguf")};
    const test::OpenModel m(copy.path);
    std::FILE *f = std::fopen(copy.path.c_str(), "ab");
    ASSERT_NE(f, nullptr);
    std::fputc(0, f);
    std::fclose(f);
    try {
        MappedHostSource src(*m.file, m.weights);
        FAIL() << "a file that grew after it was opened was mapped";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("is no longer the size it was opened at"),
                  std::string::npos)
            << e.what();
    }
}

// The bytes come from a mapping of the source's own (shared, so a registration pins the file's
// pages rather than private copies of them), not the engine's.
TEST(MappedHostSource, TheBytesAreInItsOwnMapping) {
    const test::OpenModel &m = stream_model();
    MappedHostSource src(*m.file, m.weights);
    const ExpertBytes b = src.get(0, 0);
    EXPECT_NE(b.gate, m.resident->get(0, 0).gate);
    EXPECT_TRUE(b.gate < m.file->base() || b.gate >= m.file->base() + m.file->file_size());
}

}  // namespace

// The staged upload (backend/cuda/host_upload.h) against its CPU twins: bytes that cross in
// several chunks (an odd tail included) equal the source, and every block format's device planes
// equal the host repack_* of the same blocks, bit for bit, for a tensor of several chunks; the
// device split alone equals a byte loop at the tiled kernel's edges.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/host_upload.h"
#include "backend/cuda/iq2_xxs_matvec.h"
#include "backend/cuda/q2_k_matvec.h"
#include "backend/cuda/q4_k_matvec.h"
#include "backend/cuda/q8_0_matvec.h"
#include "cuda_test_util.h"

namespace ds4::cuda {
namespace {

using test::to_host;

template <typename T>
std::vector<T> plane(const void *device, size_t n) {
    std::vector<T> v(n);
    DS4_CUDA_CHECK(cudaMemcpy(v.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

TEST(CudaHostUpload, BytesAcrossChunksEqualTheSource) {
    DS4_REQUIRE_CUDA_DEVICE();
    const size_t n = (size_t(150) << 20) + 13;  // three chunks of 64 MiB, the last one short
    std::vector<uint8_t> src(n);
    for (size_t i = 0; i < n; ++i) src[i] = uint8_t((i * 2654435761u) >> 13);
    DeviceBuffer d(n);
    DS4_CUDA_CHECK(cudaMemset(d.get(), 0xa5, n));  // poison
    upload_bytes(d.get(), src.data(), n);
    ASSERT_EQ(std::memcmp(to_host<uint8_t>(d, n).data(), src.data(), n), 0);
    release_upload_staging();
    upload_bytes(d.get(), src.data() + 1, 1000);  // staging again after a release
    ASSERT_EQ(std::memcmp(to_host<uint8_t>(d, 1000).data(), src.data() + 1, 1000), 0);
}

TEST(CudaHostUpload, SegmentOutsideTheBlockIsRefused) {
    DS4_REQUIRE_CUDA_DEVICE();
    uint8_t b[8] = {};
    EXPECT_THROW(upload_split_blocks(b, 1, 8, 4, 5, nullptr, nullptr), ds4::Error);
    // A block larger than the kernel's 8 KiB tile.
    EXPECT_THROW(split_blocks_async(nullptr, 1, 8200, 0, 8, nullptr, nullptr, nullptr), ds4::Error);
}

// The device split alone against a byte loop on the host, where the tiled kernel's edges are: a
// source one byte off a word boundary, a last tile that is short, and bytes on both sides of the
// segment. Q2_K's 84-byte block (16 scale bytes, 64 quant bytes into plane a, then d and dmin)
// fills tiles of a whole number of words; a 21-byte block fills 8,190 bytes a tile, so the tiles
// alternate between word-aligned and not and each ends in a 2-byte tail.
TEST(CudaHostUpload, SplitOfUnalignedBlocksEqualsAByteLoop) {
    DS4_REQUIRE_CUDA_DEVICE();
    struct Shape {
        int bytes, seg_off, seg_len;
    };
    for (const Shape sh : {Shape{84, 16, 64}, Shape{21, 3, 10}})
        for (const int off : {0, 1}) {
            constexpr int64_t kBlocks = 1000;  // 97 or 390 blocks a tile: the last one short
            std::vector<uint8_t> src(size_t(kBlocks) * size_t(sh.bytes) + 1);
            for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t((i * 2654435761u) >> 11);
            std::vector<uint8_t> want_a, want_b;
            for (int64_t i = 0; i < kBlocks; ++i)
                for (int j = 0; j < sh.bytes; ++j) {
                    const uint8_t v = src[size_t(off) + size_t(i) * size_t(sh.bytes) + size_t(j)];
                    (j >= sh.seg_off && j < sh.seg_off + sh.seg_len ? want_a : want_b).push_back(v);
                }
            DeviceBuffer d(src.size()), a(want_a.size()), b(want_b.size());
            DS4_CUDA_CHECK(cudaMemcpy(d.get(), src.data(), src.size(), cudaMemcpyHostToDevice));
            DS4_CUDA_CHECK(cudaMemset(a.get(), 0xa5, want_a.size()));  // poison
            DS4_CUDA_CHECK(cudaMemset(b.get(), 0xa5, want_b.size()));
            split_blocks_async(static_cast<uint8_t *>(d.get()) + off, kBlocks, sh.bytes, sh.seg_off,
                               sh.seg_len, a.get(), b.get(), nullptr);
            DS4_CUDA_CHECK(cudaDeviceSynchronize());
            const std::string where =
                std::to_string(sh.bytes) + "-byte blocks, source offset " + std::to_string(off);
            EXPECT_EQ(to_host<uint8_t>(a, want_a.size()), want_a) << where;
            EXPECT_EQ(to_host<uint8_t>(b, want_b.size()), want_b) << where;
        }
}

// 4096 x 4096 values (and 2 experts for the K formats): 32 to 72 MiB of blocks, so every format
// crosses at least one chunk boundary mid-tensor with several thousand blocks per chunk.
constexpr int64_t kRows = 4096, kK = 4096;

TEST(CudaHostUpload, Q8_0PlanesEqualHostRepack) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto blocks = quant::random_blocks(GgmlType::Q8_0, 2 * kRows * kK, 1);
    const Q8_0Weights w(blocks.data(), kRows, kK, 2);
    const Q8_0Planes want = repack_q8_0(blocks.data(), 2 * kRows, kK);
    EXPECT_EQ(plane<int8_t>(w.matrix().qs, want.qs.size()), want.qs);
    EXPECT_EQ(plane<uint16_t>(w.matrix().d, want.d.size()), want.d);
}

TEST(CudaHostUpload, Iq2xxsPlanesEqualHostRepack) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto blocks = quant::random_blocks(GgmlType::IQ2_XXS, 4 * kRows * kK, 2);
    const Iq2xxsWeights w(blocks.data(), kRows, kK, 4);
    const Iq2xxsPlanes want = repack_iq2_xxs(blocks.data(), 4 * kRows * kK / 256);
    EXPECT_EQ(plane<uint8_t>(w.experts().qs, want.qs.size()), want.qs);
    EXPECT_EQ(plane<uint16_t>(w.experts().d, want.d.size()), want.d);
}

TEST(CudaHostUpload, Q2KPlanesEqualHostRepack) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto blocks = quant::random_blocks(GgmlType::Q2_K, 4 * kRows * kK, 3);
    const Q2KWeights w(blocks.data(), kRows, kK, 4);
    const Q2KPlanes want = repack_q2_K(blocks.data(), 4 * kRows * kK / 256);
    EXPECT_EQ(plane<uint8_t>(w.experts().qs, want.qs.size()), want.qs);
    EXPECT_EQ(plane<uint8_t>(w.experts().records, want.records.size()), want.records);
}

TEST(CudaHostUpload, Q4KPlanesEqualHostRepack) {
    DS4_REQUIRE_CUDA_DEVICE();
    const auto blocks = quant::random_blocks(GgmlType::Q4_K, 2 * kRows * kK, 4);
    const Q4KWeights w(blocks.data(), kRows, kK, 2);
    const Q4KPlanes want = repack_q4_K(blocks.data(), 2 * kRows * kK / 256);
    EXPECT_EQ(plane<uint8_t>(w.experts().qs, want.qs.size()), want.qs);
    EXPECT_EQ(plane<uint8_t>(w.experts().headers, want.headers.size()), want.headers);
}

}  // namespace
}  // namespace ds4::cuda

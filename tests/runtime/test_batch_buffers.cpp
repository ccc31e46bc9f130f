// The CPU batch's buffers (runtime/batch_buffers.h): the i-th buffer taken reuses the memory of
// the i-th taken before (the same pointer while it is large enough, across clear() and
// release()), grows when asked for more, keeps what it held (buffers are never filled), and
// gives back only what was taken after a mark; with a fill, every take is filled. The session tests
// run the model on them (batches against token-by-token decode, bit for bit; filled with
// different values against not filled).
#include <gtest/gtest.h>

#include <cstring>

#include "runtime/batch_buffers.h"

namespace ds4::runtime {
namespace {

TEST(BatchBuffers, TheSameSequenceReusesTheSameMemory) {
    BatchBuffers b;
    float *x = b.take(1000), *y = b.take(10);
    ASSERT_NE(x, y);
    x[999] = 7.0f;
    EXPECT_EQ(b.mark(), 2u);
    b.clear();
    EXPECT_EQ(b.mark(), 0u);
    EXPECT_EQ(b.take(500), x);  // smaller: the same block, not filled
    EXPECT_EQ(x[999], 7.0f);
    EXPECT_EQ(b.take(10), y);
    EXPECT_EQ(b.capacity(), 1010u);
}

TEST(BatchBuffers, GrowsABlockThatIsTooSmall) {
    BatchBuffers b;
    b.take(4);
    b.clear();
    float *big = b.take(1 << 20);
    big[(1 << 20) - 1] = 1.0f;  // the whole request is there (ASan checks the bound)
    EXPECT_EQ(b.capacity(), size_t(1) << 20);
}

TEST(BatchBuffers, ReleaseGivesBackOnlyWhatCameAfterTheMark) {
    BatchBuffers b;
    float *keep = b.take(8);
    const size_t m = b.mark();
    float *scratch = b.take(16);
    std::memset(scratch, 0, 16 * sizeof(float));
    b.release(m);
    EXPECT_EQ(b.mark(), 1u);
    EXPECT_EQ(b.take(16), scratch);  // the sublayer's scratch, again
    EXPECT_NE(b.take(8), keep);      // a third block, not the first
    b.release(5);                    // a mark above the count changes nothing
    EXPECT_EQ(b.mark(), 3u);
}

TEST(BatchBuffers, AFillIsWrittenAtEveryTake) {
    BatchBuffers b(-2.5f);
    float *x = b.take(100);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(x[i], -2.5f) << i;
    x[5] = 1.0f;
    b.clear();
    ASSERT_EQ(b.take(50), x);  // reused, and filled again
    for (int i = 0; i < 50; ++i) ASSERT_EQ(x[i], -2.5f) << i;
}

TEST(BatchBuffers, FreeAllGivesTheMemoryBack) {
    BatchBuffers b;
    b.take(1000);
    b.take(10);
    b.clear();
    b.free_all();
    EXPECT_EQ(b.capacity(), 0u);
    EXPECT_EQ(b.mark(), 0u);
    b.take(3);
    EXPECT_EQ(b.capacity(), 3u);
}

TEST(BatchBuffers, ZeroFloatsIsStillABuffer) {
    BatchBuffers b;
    EXPECT_NE(b.take(0), nullptr);
    EXPECT_EQ(b.mark(), 1u);
}

}  // namespace
}  // namespace ds4::runtime

// The operation profiles' table (runtime/op_times.h, DS4_CPU_PROFILE / DS4_CUDA_PROFILE) and the
// CPU profile's scopes (runtime/cpu_profile.h): classes summed and sorted by time, per-token
// figures from the counted tokens, weight roles named without the layer, decode and prefill
// batches in tables of their own, nothing printed when off or nothing was timed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "gguf/gguf_file.h"
#include "runtime/cpu_profile.h"
#include "runtime/op_times.h"

namespace ds4::runtime {
namespace {

TEST(OpTimes, SumsClassesSortsByTimeAndDividesByTokens) {
    OpTimes t;
    t.add("small", 1.0, 0);
    t.add("big", 6.0, 4e9);
    t.add("big", 2.0, 4e9);
    t.count_tokens(2);
    testing::internal::CaptureStderr();
    t.report("test table");
    const std::string out = testing::internal::GetCapturedStderr();
    // 9 ms over 2 tokens; 8 GB of weights over 2 tokens.
    EXPECT_NE(out.find("test table: 2 tokens, 4.500 ms per token timed, 4.000 GB of weights"),
              std::string::npos)
        << out;
    const size_t big = out.find("  big"), small = out.find("  small");
    ASSERT_NE(big, std::string::npos) << out;
    ASSERT_NE(small, std::string::npos) << out;
    EXPECT_LT(big, small) << "sorted by time";
    // big: 2 calls / 2 tokens = 1.0 a token, 4 ms a token, 88.9 %, 4000 MB a token, 1000 GB/s.
    EXPECT_NE(out.find("1.0     4.0000   88.9    4000.00     1000"), std::string::npos) << out;
}

TEST(OpTimes, PrintsNothingWithoutTokensOrClasses) {
    OpTimes empty, untimed;
    untimed.add("x", 1.0, 0);
    testing::internal::CaptureStderr();
    empty.report("a");
    untimed.report("b");
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(OpTimes, WeightRoleDropsTheLayerAndNamesTheFormat) {
    gguf::TensorInfo layer, head;
    layer.name = "blk.31.attn_q_a.weight";
    layer.type = GgmlType::Q8_0;
    head.name = "output.weight";
    head.type = GgmlType::F16;
    EXPECT_EQ(weight_role(&layer), "attn_q_a Q8_0");
    EXPECT_EQ(weight_role(&head), "output F16");
}

TEST(CpuProfile, ScopesTimeDecodeAndPrefillApartAndOnlyWhenAsked) {
    ::setenv("DS4_CPU_PROFILE", "0", 1);
    testing::internal::CaptureStderr();
    {
        CpuProfile off;
        EXPECT_FALSE(off.on());
        off.begin_batch(1);
        { CpuScope s(off, "never"); }
        off.end_batch();
    }
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
    ::setenv("DS4_CPU_PROFILE", "1", 1);
    testing::internal::CaptureStderr();
    {
        CpuProfile p;
        ASSERT_TRUE(p.on());
        p.begin_batch(1);
        {
            CpuScope s(p, "phase a");
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            s.next("phase b");
        }
        p.end_batch();
        p.begin_batch(8);
        { CpuScope s(p, "prefill op"); }
        p.end_batch();
    }
    const std::string out = testing::internal::GetCapturedStderr();
    ::unsetenv("DS4_CPU_PROFILE");
    const size_t decode = out.find("CPU profile, decode (one-token batches): 1 tokens");
    const size_t prefill = out.find("CPU profile, prefill (batches of several tokens): 8 tokens");
    ASSERT_NE(decode, std::string::npos) << out;
    ASSERT_NE(prefill, std::string::npos) << out;
    const size_t a = out.find("phase a"), b = out.find("phase b"), op = out.find("prefill op");
    EXPECT_TRUE(decode < a && a < prefill && decode < b && b < prefill) << out;
    EXPECT_GT(op, prefill) << out;
    EXPECT_LT(a, b) << out << "phase a slept 2 ms: the tables are sorted by time";
}

}  // namespace
}  // namespace ds4::runtime

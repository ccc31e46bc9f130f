// The published Flash layout, built in memory from the layout table (no 86 GB file needed):
// strict recognition, and the byte totals that docs/MODEL.md Appendix A computes independently from
// the block sizes (86,714,775,900 B for q2, 164,628,167,004 B for q4).
#include <gtest/gtest.h>

#include "gguf/gguf_writer.h"
#include "in_memory_model.h"
#include "model/model_summary.h"
#include "model/synthetic_model.h"
#include "model/tensor_layout.h"
#include "model/weights.h"

using namespace ds4;
using namespace ds4::model;

namespace {

using test::InMemoryModel;

void build(InMemoryModel &m, GgmlType gate_up, GgmlType down) {
    test::build_in_memory(m, shape_preset("flash", 129280), gate_up, down);
}

TEST(FlashLayout, TensorCountAndBytesMatchTheSpec) {
    InMemoryModel q2, q4;
    build(q2, GgmlType::IQ2_XXS, GgmlType::Q2_K);
    build(q4, GgmlType::Q4_K, GgmlType::Q4_K);
    EXPECT_EQ(q2.infos.size(), 1328u);  // docs/MODEL.md 2.2
    EXPECT_EQ(bytes_by_class(q2.hp, q2.w).back().bytes, 86714775900ull);
    EXPECT_EQ(bytes_by_class(q4.hp, q4.w).back().bytes, 164628167004ull);
    // docs/MODEL.md 11.1: routed experts 77.91 GB (q2), 277.03 B routed parameters, 284.34 B in all
    // (the table rounds; 0.01 B of slack).
    const auto c = bytes_by_class(q2.hp, q2.w);
    EXPECT_NEAR(c[0].bytes / 1e9, 77.91, 0.005);
    EXPECT_NEAR(c[0].params / 1e9, 277.03, 0.01);
    EXPECT_NEAR(c.back().params / 1e9, 284.34, 0.01);
    EXPECT_EQ(routed_quant_mix(q2.hp, q2.w), "q2");
    EXPECT_EQ(routed_quant_mix(q4.hp, q4.w), "q4");
}

TEST(FlashLayout, StrictAcceptsPublishedMixesAndNamesTheFirstDifference) {
    InMemoryModel q2, q4, q8;
    build(q2, GgmlType::IQ2_XXS, GgmlType::Q2_K);
    build(q4, GgmlType::Q4_K, GgmlType::Q4_K);
    build(q8, GgmlType::Q8_0, GgmlType::Q8_0);
    EXPECT_EQ(strict_flash_mismatch(q2.hp, q2.w), "");
    EXPECT_EQ(strict_flash_mismatch(q4.hp, q4.w), "");
    EXPECT_EQ(
        strict_flash_mismatch(q8.hp, q8.w),
        "blk.0: routed experts are q8_0, the published layouts are IQ2_XXS/Q2_K (q2) or Q4_K (q4)");
    // Mixed per-layer q2/q4 files are legitimate (docs/MODEL.md 2.2).
    const_cast<gguf::TensorInfo *>(q2.w.layers[7].ffn_gate_exps)->type = GgmlType::Q4_K;
    const_cast<gguf::TensorInfo *>(q2.w.layers[7].ffn_up_exps)->type = GgmlType::Q4_K;
    const_cast<gguf::TensorInfo *>(q2.w.layers[7].ffn_down_exps)->type = GgmlType::Q4_K;
    EXPECT_EQ(strict_flash_mismatch(q2.hp, q2.w), "");
    EXPECT_EQ(routed_quant_mix(q2.hp, q2.w), "mixed");
    const_cast<gguf::TensorInfo *>(q4.w.layers[5].attn_q_b)->type = GgmlType::F16;
    EXPECT_EQ(strict_flash_mismatch(q4.hp, q4.w),
              "tensor 'blk.5.attn_q_b.weight' is F16, the published layout has Q8_0");
    q4.hp.compress_ratio[3] = 4;
    EXPECT_EQ(strict_flash_mismatch(q4.hp, q4.w), "compress_ratios[3] is 4, Flash has 128");
}

TEST(FlashLayout, TinyIsNotFlash) {
    const HParams h = shape_preset("tiny", 129280);
    EXPECT_FALSE(h.is_flash());
    EXPECT_EQ(h.flash_mismatch(), "block_count is 6, Flash has 43");
    EXPECT_TRUE(shape_preset("flash", 129280).is_flash());
}

}  // namespace

#pragma once
// One int8 tensor-core product (mma.sync m16n8k32, s8 x s8 -> s32) as the prefill kernels use
// it: the exact int32 sums of 32 values for a 16-row x 8-token tile, from zero.
//
// Fragments, by the PTX ISA's m16n8k32 .s8 layout (g = lane / 4, c = lane % 4): a0 row g, a1
// row g + 8, a2 and a3 the same rows 16 k further; b0 token g, b1 16 k further; c0, c1 row g,
// tokens 2 c and 2 c + 1, c2, c3 row g + 8. Which value plays which k does not matter to an exact
// integer sum as long as a and b agree, so the callers hand lane c the 8 consecutive values
// 8 c .. 8 c + 7 of the 32 (a0/b0 the first four, a2/b1 the last four): one 8-byte load each.
namespace ds4::cuda::dev {

__device__ __forceinline__ void mma_s8_block(const int (&a)[4], int b0, int b1, int (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %10, %10, %10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

}  // namespace ds4::cuda::dev

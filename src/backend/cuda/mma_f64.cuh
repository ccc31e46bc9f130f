#pragma once
// One double-precision tensor-core product (mma.sync m8n8k4, f64): d += a b for an 8 x 4 tile of
// A and a 4 x 8 tile of B, in the accumulator's registers.
//
// Fragments, by the PTX ISA's m8n8k4 .f64 layout (g = lane / 4, c = lane % 4): a holds A[g][c],
// b holds B[c][g], d0 and d1 hold D[g][2 c] and D[g][2 c + 1]. The operation is deterministic,
// so an output's bits depend only on its inputs and the order of the k steps that feed it, not
// on the tile it shares with other outputs.
namespace ds4::cuda::dev {

__device__ __forceinline__ void mma_f64(double (&d)[2], double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+d"(d[0]), "+d"(d[1])
                 : "d"(a), "d"(b));
}

}  // namespace ds4::cuda::dev

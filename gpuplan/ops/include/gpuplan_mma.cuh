// Tensor-core building blocks for sm_80+: cp.async copies, ldmatrix and mma.sync m16n8k16
// (f16/bf16 inputs, f32 accumulators), and packing two floats into an A-fragment register.
// Fragment layouts (lane = 4 * g + t, g = lane >> 2, t = lane & 3), PTX ISA "mma.m16n8k16":
//   A (16x16, row major): a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]
//                         a[2] = A[g][2t+8..+9]   a[3] = A[g+8][2t+8..+9]
//   B (16x8, stored n-major): b0 = B[k=2t..2t+1][n=g]   b1 = B[k=2t+8..+9][n=g]
//   C (16x8, f32): c[0] = C[g][2t]  c[1] = C[g][2t+1]  c[2] = C[g+8][2t]  c[3] = C[g+8][2t+1]
// so the C fragments of two adjacent 16x8 tiles, rounded and packed in pairs, are the A
// fragment of one 16x16 tile (how P = softmax(S) feeds the next mma without shared memory).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace gp {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, or 16 zero bytes when !valid (nothing is read then).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
#if __CUDA_ARCH__ >= 800
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes));
#else
    __trap();
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
#endif
}

// ldmatrix .x4 from shared byte address `addr` (this lane's row address): lanes 8j..8j+7
// address the rows of matrix j; register j receives row g, columns 2t..2t+1 of matrix j
// (with TRANS: rows 2t..2t+1 of column g).
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
#if __CUDA_ARCH__ >= 800
    if constexpr (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    }
#else
    __trap();
#endif
}

// c += a (16x16) * b (16x8), f32 accumulators.
template <typename T> struct Mma;
template <> struct Mma<__half> {
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
        __trap();
#endif
    }
};
template <> struct Mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
        __trap();
#endif
    }
};

// Two floats rounded to T and packed: `lo` in the low 16 bits (the lower column).
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
    return static_cast<unsigned>(__half_as_ushort(__float2half_rn(lo)))
           | (static_cast<unsigned>(__half_as_ushort(__float2half_rn(hi))) << 16);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
    return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(lo)))
           | (static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// The A fragment of k-step kk (columns 16kk..16kk+15) from the C fragments c[2kk], c[2kk+1]
// of 16x8 tiles that span those columns.
template <typename T, int N>
__device__ __forceinline__ void c_to_a(unsigned (&a)[4], const float (&c)[N][4], int kk) {
    a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
    a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
    a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// This lane's ldmatrix row address (element offset) in a row-major [rows][ld] shared tile:
//   a_lane: the A fragment of rows row0..row0+15, columns col0..col0+15 (non-trans);
//   b_lane: B fragments of two n-tiles, rows (n) n0..n0+15 of a [n][k] tile, k0..k0+15
//           (non-trans: the tile is stored n-major, e.g. K for S = Q K^T);
//   bt_lane: B fragments of two n-tiles from a [k][n] tile (columns n0..n0+15, rows k0..
//           k0+15), with ldmatrix.trans (e.g. V for O = P V).
// Each gives registers {b0, b1} of n-tile n0/8 in r[0], r[1] and of n0/8 + 1 in r[2], r[3].
__device__ __forceinline__ int a_lane(int lane, int ld, int row0, int col0) {
    const int q = lane >> 3, r = lane & 7;
    return (row0 + (q & 1) * 8 + r) * ld + col0 + (q >> 1) * 8;
}
__device__ __forceinline__ int b_lane(int lane, int ld, int n0, int k0) {
    const int q = lane >> 3, r = lane & 7;
    return (n0 + (q >> 1) * 8 + r) * ld + k0 + (q & 1) * 8;
}
__device__ __forceinline__ int bt_lane(int lane, int ld, int k0, int n0) {
    const int q = lane >> 3, r = lane & 7;
    return (k0 + (q & 1) * 8 + r) * ld + n0 + (q >> 1) * 8;
}

}  // namespace gp

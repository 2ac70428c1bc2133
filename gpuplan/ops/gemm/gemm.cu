// GEMM kernels: C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] (+ bias[n]), row major.
// A is [M, K] ([K, M] when TA), B is [K, N] ([N, K] when TB), C is [M, N]; batch b walks
// grid.z with element strides stride_a / stride_b (0 broadcasts a 2-D operand) and M*N.
// beta == 0 never reads C (it may hold NaN), as in BLAS. Every kernel reduces over k in a
// fixed order, so results are deterministic; no split-K, no atomics.
//
// EPI: the epilogue activation, an `Activation` enumerator (gpuplan_activation.cuh, the math
// shared with activation.cu; the rows allowed here are gemm_sku.py's EPILOGUES) or
// EPI_NONE. With one, C = f(v) and, where `pre` is not null, pre = v (the pre-activation a
// backward needs), v = alpha * acc + beta * C + bias in the accumulator type.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_activation.cuh"
#include "gpuplan_mma.cuh"

namespace gemm {

constexpr int EPI_NONE = -1;

// ---------------------------------------------------------------------------------------
// Shared epilogue: v = alpha * acc + beta * C + bias[n]; C = v (EPI_NONE) or f(v), and pre = v
// when an activation's `pre` is not null; each rounded once to T.
template <int EPI, typename T, typename Acc>
__device__ __forceinline__ void store_out(T* __restrict__ c, T* __restrict__ pre,
                                          const T* __restrict__ bias, long long idx,
                                          long long n, Acc v, Acc alpha, Acc beta,
                                          int has_bias) {
    v = alpha * v;
    if (beta != Acc(0)) v += beta * static_cast<Acc>(gp::to_acc<T>(c[idx]));
    if (has_bias) v += static_cast<Acc>(gp::to_acc<T>(bias[n]));
    if constexpr (EPI != EPI_NONE) {
        if (pre != nullptr) pre[idx] = gp::from_acc<T>(v);
        v = gp::act_forward<EPI, Acc>(v, Acc(0));
    }
    c[idx] = gp::from_acc<T>(v);
}

// ---------------------------------------------------------------------------------------
// Tensor-core kernel for f16 / bf16 (sm_80+): 128x128x32 block tile, 8 warps in a 2 (M) x 4
// (N) grid, each warp a 64x32 tile = 4 x 4 mma.sync.m16n8k16 tiles with f32 accumulators.
// Shared memory holds STAGES k-tiles of A and B, filled by cp.async (16-byte chunks, zero
// fill outside the matrix) when VEC, or by bounds-checked scalar copies otherwise.
//
// Shared-memory layouts of one operand tile (rows = m for A, n for B), padded by 8 halves so
// the 8 row addresses of every ldmatrix hit distinct 16-byte bank groups:
//   K-contiguous  ("KC", A when !TA, B when TB):  s[row * 40 + k],   row < 128, k < 32
//   row-contiguous ("RC", A when TA, B when !TB): s[k * 136 + row],  k < 32, row < 128
// KC tiles feed ldmatrix directly; RC tiles are transposed on the way by ldmatrix.trans.
//
// mma.sync.m16n8k16.row.col fragments (lane = 4 * g + t, g = lane >> 2, t = lane & 3):
//   A (16x16, row major): a0 = A[g][2t..2t+1]   a1 = A[g+8][2t..2t+1]
//                         a2 = A[g][2t+8..+9]   a3 = A[g+8][2t+8..+9]
//   B (16x8, "col" = stored n-major): b0 = B[k=2t..2t+1][n=g]   b1 = B[k=2t+8..+9][n=g]
//   C (16x8, f32): c0 = C[g][2t]  c1 = C[g][2t+1]  c2 = C[g+8][2t]  c3 = C[g+8][2t+1]
// ldmatrix.x4: lanes 8j..8j+7 give the 8 row addresses of matrix j; lane receives, in
// register j, row g, columns 2t..2t+1 of matrix j (with .trans: rows 2t..2t+1 of column g).
namespace tc {
constexpr int BM = 128, BN = 128, BK = 32, STAGES = 4, THREADS = 256;
constexpr int KC_LD = BK + 8;   // 40 halves = 80 bytes per row
constexpr int RC_LD = BM + 8;   // 136 halves = 272 bytes per row (BM == BN)
constexpr int TILE = (BM * KC_LD > BK * RC_LD) ? BM * KC_LD : BK * RC_LD;  // halves
constexpr int SMEM_BYTES = STAGES * 2 * TILE * 2;  // A and B tiles, 2-byte elements
static_assert(BM == BN, "one padded leading dimension serves both operands");
static_assert((KC_LD * 2) % 16 == 0 && (RC_LD * 2) % 16 == 0, "16-byte aligned rows");
static_assert((TILE * 2) % 16 == 0, "16-byte aligned tiles");
}  // namespace tc

// cp.async, ldmatrix and mma.sync wrappers: the ones the attention kernels use too.
using gp::cp_async16;
using gp::cp_async_commit;
using gp::cp_async_wait;
using gp::ldmatrix_x4;
using gp::Mma;
using gp::smem_addr;

// Element offset of (row, k) in a shared tile of either layout.
template <bool KC>
__device__ __forceinline__ int tile_offset(int row, int k) {
    return KC ? row * tc::KC_LD + k : k * tc::RC_LD + row;
}

// Copy one 128-row x 32-k tile of an operand into shared memory (zeros outside the matrix).
// KC: the operand is [rows, K] in global memory (ld = K); else it is [K, rows] (ld = rows).
// VEC needs the contiguous extent to be a multiple of 8 and a 16-byte aligned base, so a
// 16-byte chunk of 8 elements is either wholly inside the matrix or wholly outside.
template <typename T, bool KC, bool VEC>
__device__ __forceinline__ void load_tile(T* __restrict__ s, unsigned s_addr,
                                          const T* __restrict__ g, int rows, int K, int row0,
                                          int k0, int tid) {
    using namespace tc;
    if constexpr (VEC) {
        constexpr int CHUNKS = BM * BK / 8, PER_THREAD = CHUNKS / THREADS;  // 512, 2
        static_assert(PER_THREAD * THREADS == CHUNKS, "whole chunks per thread");
#pragma unroll
        for (int l = 0; l < PER_THREAD; ++l) {
            const int c = tid + l * THREADS;
            // KC: 4 chunks per 32-k row; RC: 16 chunks per 128-row line of one k.
            const int r = KC ? c / (BK / 8) : (c % (BM / 8)) * 8;
            const int k = KC ? (c % (BK / 8)) * 8 : c / (BM / 8);
            const int gr = row0 + r, gk = k0 + k;
            const bool valid = gr < rows && gk < K;
            const T* src = g;
            if (valid) {
                src = KC ? g + static_cast<long long>(gr) * K + gk
                         : g + static_cast<long long>(gk) * rows + gr;
            }
            cp_async16(s_addr + 2u * tile_offset<KC>(r, k), src, valid);
        }
    } else {
        const T zero = gp::from_float<T>(0.0f);
#pragma unroll 4
        for (int e = tid; e < BM * BK; e += THREADS) {
            // consecutive threads walk the memory-contiguous index (coalesced reads)
            const int r = KC ? e / BK : e % BM;
            const int k = KC ? e % BK : e / BM;
            const int gr = row0 + r, gk = k0 + k;
            T v = zero;
            if (gr < rows && gk < K) {
                v = KC ? g[static_cast<long long>(gr) * K + gk]
                       : g[static_cast<long long>(gk) * rows + gr];
            }
            s[tile_offset<KC>(r, k)] = v;
        }
    }
}

// This lane's ldmatrix row address (element offset in a tile, for kk = 0 and the warp's
// first 16 rows). ldmatrix.x4 matrix q = lane / 8 takes its row lane % 8 from this lane.
//   A, KC:  q = (m 0-7,k 0-7) (m 8-15,k 0-7) (m 0-7,k 8-15) (m 8-15,k 8-15) -> a0 a1 a2 a3
//   A, RC:  the same four blocks stored k-major (rows are k), transposed by .trans
//   B, KC:  q = (n 0-7,k 0-7) (n 0-7,k 8-15) (n 8-15,k 0-7) (n 8-15,k 8-15)
//           -> b0, b1 of n-tile 0, then b0, b1 of n-tile 1 (16 columns per ldmatrix)
//   B, RC:  the same four blocks stored k-major, transposed by .trans
template <bool KC>
__device__ __forceinline__ int a_lane_offset(int lane, int wm0) {
    const int q = lane >> 3, r = lane & 7;
    return KC ? tile_offset<true>(wm0 + (q & 1) * 8 + r, (q >> 1) * 8)
              : tile_offset<false>(wm0 + (q & 1) * 8, (q >> 1) * 8 + r);
}
template <bool KC>
__device__ __forceinline__ int b_lane_offset(int lane, int wn0) {
    const int q = lane >> 3, r = lane & 7;
    return KC ? tile_offset<true>(wn0 + (q >> 1) * 8 + r, (q & 1) * 8)
              : tile_offset<false>(wn0 + (q >> 1) * 8, (q & 1) * 8 + r);
}

// One 32-deep k-tile of mma for this warp's 64x32 output tile; a_addr / b_addr are this
// lane's shared byte addresses from a_lane_offset / b_lane_offset in the current stage.
template <typename T, bool A_KC, bool B_KC>
__device__ __forceinline__ void mma_tile(unsigned a_addr, unsigned b_addr,
                                         float (&acc)[4][4][4]) {
    using namespace tc;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        unsigned bf[4][2];
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            unsigned t4[4];
            ldmatrix_x4<!B_KC>(t4, b_addr + 2u * tile_offset<B_KC>(p * 16, kk));
            bf[2 * p][0] = t4[0];
            bf[2 * p][1] = t4[1];
            bf[2 * p + 1][0] = t4[2];
            bf[2 * p + 1][1] = t4[3];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            unsigned af[4];
            ldmatrix_x4<!A_KC>(af, a_addr + 2u * tile_offset<A_KC>(i * 16, kk));
#pragma unroll
            for (int n = 0; n < 4; ++n) Mma<T>::run(acc[i][n], af, bf[n][0], bf[n][1]);
        }
    }
}

// grid = (ceil(M / 128), ceil(N / 128), min(batch, 65535)), block = 256, dynamic shared
// memory tc::SMEM_BYTES. The cp.async (VEC) kernels with a k-contiguous A and no activation
// are held to 128 registers for two blocks per SM; the others need more (they spill at 128:
// an activation's math runs while all 64 accumulators are live) and run one.
template <typename T, bool TA, bool TB, bool VEC, int EPI>
__global__ void __launch_bounds__(tc::THREADS, (VEC && !TA && EPI == EPI_NONE) ? 2 : 1)
gemm_tc(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
        T* __restrict__ pre, const T* __restrict__ bias, long long M, long long N, long long K,
        long long batch, long long stride_a, long long stride_b, float alpha, float beta,
        int has_bias) {
    using namespace tc;
    constexpr bool A_KC = !TA;  // A [M, K] is k-contiguous
    constexpr bool B_KC = TB;   // B [N, K] is k-contiguous
    constexpr unsigned STAGE_BYTES = 2u * TILE * 2u;  // A tile then B tile
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* smem = reinterpret_cast<T*>(smem_raw);
    const unsigned smem_u32 = smem_addr(smem_raw);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp & 1) * 64, wn0 = (warp >> 1) * 32;
    const unsigned a_lane = 2u * a_lane_offset<A_KC>(lane, wm0);
    const unsigned b_lane = 2u * TILE + 2u * b_lane_offset<B_KC>(lane, wn0);
    // Extents fit in int (the plan keeps them below 2^31 - 1024); offsets use 64 bits.
    const int Mi = static_cast<int>(M), Ni = static_cast<int>(N), Ki = static_cast<int>(K);
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int nk = (Ki + BK - 1) / BK;

    for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
        const T* a = A + b * stride_a;
        const T* bm = B + b * stride_b;

        float acc[4][4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][n][e] = 0.0f;

        // Pipeline: k-tile kt lives in stage kt % STAGES; one commit group per k-tile (empty
        // groups past the end keep the wait count uniform).
        auto load_stage = [&](int kt) {
            const int s = kt % STAGES;
            const int k0 = kt * BK;
            T* st = smem + s * 2 * TILE;
            const unsigned sa = smem_u32 + s * STAGE_BYTES;
            load_tile<T, A_KC, VEC>(st, sa, a, Mi, Ki, m0, k0, tid);
            load_tile<T, B_KC, VEC>(st + TILE, sa + 2u * TILE, bm, Ni, Ki, n0, k0, tid);
        };
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < nk) load_stage(s);
            cp_async_commit();
        }
        for (int kt = 0; kt < nk; ++kt) {
            cp_async_wait<STAGES - 2>();  // this thread's copies of k-tiles 0..kt have landed
            __syncthreads();              // ... everyone's; and stage (kt - 1) % STAGES is free
            if (kt + STAGES - 1 < nk) load_stage(kt + STAGES - 1);
            cp_async_commit();
            const unsigned st = smem_u32 + (kt % STAGES) * STAGE_BYTES;
            mma_tile<T, A_KC, B_KC>(st + a_lane, st + b_lane, acc);
        }
        cp_async_wait<0>();
        __syncthreads();  // the next batch entry's prologue overwrites stages still being read

        // Fragment (i, n): rows g (c0, c1) and g + 8 (c2, c3), columns 2t and 2t + 1.
        T* c = C + b * M * N;
        T* p = pre == nullptr ? nullptr : pre + b * M * N;
        const int row0 = m0 + wm0 + (lane >> 2);
        const int col0 = n0 + wn0 + 2 * (lane & 3);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = row0 + i * 16 + h * 8;
                if (m >= Mi) continue;
                T* crow = c + static_cast<long long>(m) * N;
                T* prow = p == nullptr ? nullptr : p + static_cast<long long>(m) * N;
#pragma unroll
                for (int n = 0; n < 4; ++n) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int col = col0 + n * 8 + e;
                        if (col < Ni) {
                            store_out<EPI, T, float>(crow, prow, bias, col, col,
                                                     acc[i][n][2 * h + e], alpha, beta,
                                                     has_bias);
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// CUDA-core kernel for f32 / f64: BM x BN x 8 block tile, 256 threads in a (BM/TM) x (BN/TN)
// grid, each thread a TM x TN register tile whose rows are strided by BM/TM and columns by
// BN/TN (conflict-free shared reads, coalesced stores). Global loads for tile k+1 go to
// registers while tile k is multiplied, then to the other shared buffer. Each output is one
// fma chain over k in ascending order: deterministic and independent of the device.
// Operand tile of the FMA kernel: ROWS x BK elements of a matrix of `rows` x K (rows = M
// for A, N for B). RC: the matrix is [K, rows] in memory (A^T stored, or B), else [rows, K].
// Element e of the tile maps to (r, k) so that the memory-contiguous index varies fastest
// across threads (coalesced loads); shared memory holds it k-major as s[k][r].
template <int ROWS, int BK, bool RC>
__device__ __forceinline__ void fma_coords(int e, int& r, int& k) {
    if (RC) { r = e % ROWS; k = e / ROWS; }
    else    { r = e / BK;   k = e % BK; }
}
template <typename T, bool RC, int ROWS, int BK, int THREADS>
__device__ __forceinline__ void fma_load(T (&reg)[ROWS * BK / THREADS], const T* __restrict__ g,
                                         int rows, int K, int row0, int k0, int tid) {
#pragma unroll
    for (int l = 0; l < ROWS * BK / THREADS; ++l) {
        int r, k;
        fma_coords<ROWS, BK, RC>(tid + l * THREADS, r, k);
        const int gr = row0 + r, gk = k0 + k;
        T v = T(0);
        if (gr < rows && gk < K) {
            v = RC ? g[static_cast<long long>(gk) * rows + gr]
                   : g[static_cast<long long>(gr) * K + gk];
        }
        reg[l] = v;
    }
}
template <typename T, bool RC, int ROWS, int BK, int THREADS, int LD>
__device__ __forceinline__ void fma_store(T (&s)[BK][LD], const T (&reg)[ROWS * BK / THREADS],
                                          int tid) {
#pragma unroll
    for (int l = 0; l < ROWS * BK / THREADS; ++l) {
        int r, k;
        fma_coords<ROWS, BK, RC>(tid + l * THREADS, r, k);
        s[k][r] = reg[l];
    }
}

// With an activation, at least one block per SM (0: no minimum) is stated: left free, ptxas
// held one f32 instance to 128 registers and spilled.
template <typename T, bool TA, bool TB, int BM, int BN, int TM, int TN, int EPI>
__global__ void __launch_bounds__((BM / TM) * (BN / TN), EPI == EPI_NONE ? 0 : 1)
gemm_fma(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
         T* __restrict__ pre, const T* __restrict__ bias, long long M, long long N, long long K,
         long long batch, long long stride_a, long long stride_b, T alpha, T beta,
         int has_bias) {
    constexpr int BK = 8, PAD = 4;
    constexpr int TX = BN / TN, TY = BM / TM, THREADS = TX * TY;
    constexpr int LA = BM * BK / THREADS, LB = BN * BK / THREADS;
    static_assert(LA * THREADS == BM * BK && LB * THREADS == BN * BK, "whole tiles per thread");
    __shared__ T As[2][BK][BM + PAD];
    __shared__ T Bs[2][BK][BN + PAD];

    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    // Extents fit in int (the plan keeps them below 2^31 - 1024); offsets use 64 bits.
    const int Mi = static_cast<int>(M), Ni = static_cast<int>(N), Ki = static_cast<int>(K);
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int nk = (Ki + BK - 1) / BK;

    for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
        const T* a = A + b * stride_a;
        const T* bm = B + b * stride_b;
        T* c = C + b * M * N;
        T* p = pre == nullptr ? nullptr : pre + b * M * N;
        T ra[LA], rb[LB];
        T acc[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

        if (nk > 0) {
            fma_load<T, TA, BM, BK, THREADS>(ra, a, Mi, Ki, m0, 0, tid);
            fma_load<T, !TB, BN, BK, THREADS>(rb, bm, Ni, Ki, n0, 0, tid);
            fma_store<T, TA, BM, BK, THREADS, BM + PAD>(As[0], ra, tid);
            fma_store<T, !TB, BN, BK, THREADS, BN + PAD>(Bs[0], rb, tid);
        }
        __syncthreads();
        for (int kt = 0; kt < nk; ++kt) {
            const int buf = kt & 1;
            if (kt + 1 < nk) {
                const int k0 = (kt + 1) * BK;
                fma_load<T, TA, BM, BK, THREADS>(ra, a, Mi, Ki, m0, k0, tid);
                fma_load<T, !TB, BN, BK, THREADS>(rb, bm, Ni, Ki, n0, k0, tid);
            }
#pragma unroll
            for (int k = 0; k < BK; ++k) {
                T va[TM], vb[TN];
#pragma unroll
                for (int i = 0; i < TM; ++i) va[i] = As[buf][k][ty + i * TY];
#pragma unroll
                for (int j = 0; j < TN; ++j) vb[j] = Bs[buf][k][tx + j * TX];
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = fma(va[i], vb[j], acc[i][j]);
            }
            // Buffer buf ^ 1 was last read in iteration kt - 1, before the barrier below it.
            if (kt + 1 < nk) {
                fma_store<T, TA, BM, BK, THREADS, BM + PAD>(As[buf ^ 1], ra, tid);
                fma_store<T, !TB, BN, BK, THREADS, BN + PAD>(Bs[buf ^ 1], rb, tid);
            }
            __syncthreads();
        }

#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int m = m0 + ty + i * TY;
            if (m >= Mi) continue;
            T* crow = c + static_cast<long long>(m) * N;
            T* prow = p == nullptr ? nullptr : p + static_cast<long long>(m) * N;
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int col = n0 + tx + j * TX;
                if (col < Ni) {
                    store_out<EPI, T, T>(crow, prow, bias, col, col, acc[i][j], alpha, beta,
                                         has_bias);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// C = beta * C + bias[n] over `total` = batch * M * N elements (beta == 0: C is not read).
// The cuBLAS SKU runs it before a beta = 1 GEMM (bias epilogue), and for K == 0.
template <typename T>
__global__ void gemm_scale_bias(T* __restrict__ C, const T* __restrict__ bias, long long total,
                                long long N, typename gp::acc_type<T>::type beta, int has_bias) {
    using Acc = typename gp::acc_type<T>::type;
    const long long step = static_cast<long long>(blockDim.x) * gridDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += step) {
        Acc v = Acc(0);
        if (beta != Acc(0)) v = beta * gp::to_acc<T>(C[i]);
        if (has_bias) v += gp::to_acc<T>(bias[i % N]);
        C[i] = gp::from_acc<T>(v);
    }
}

// C = f(C) over `total` elements, pre = C first when pre is not null: the cuBLAS SKU's
// activation epilogue, after the GEMM (the pre-activation is rounded to T before f).
template <typename T, int EPI>
__global__ void gemm_activation(T* __restrict__ C, T* __restrict__ pre, long long total) {
    using Acc = typename gp::acc_type<T>::type;
    const long long step = static_cast<long long>(blockDim.x) * gridDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += step) {
        const T v = C[i];
        if (pre != nullptr) pre[i] = v;
        C[i] = gp::from_acc<T>(gp::act_forward<EPI, Acc>(gp::to_acc<T>(v), Acc(0)));
    }
}

}  // namespace gemm

// Fused attention backward (FlashAttention-2 style), SIMT kernels for every dtype, D <= 32*C.
// From q, k, v, o, dout [B, L, D] and the forward's lse [B, Lq] (A = f32; f64 for f64):
//   delta_i = sum_c dout[i, c] o[i, c]                         (attention_backward_delta)
//   P_ij = exp(scale * q_i . k_j - lse_i) (0 where masked),  dP_ij = dout_i . v_j,
//   dS_ij = P_ij (dP_ij - delta_i)
//   dv_j = sum_i P_ij dout_i,  dk_j = scale sum_i dS_ij q_i  (attention_backward_dkdv_simt)
//   dq_i = scale sum_j dS_ij k_j                             (attention_backward_dq_simt)
// P is recomputed tile by tile; no [Lq, Lk] buffer. dk/dv: one CTA per 16-key tile looping
// over query tiles; dq: one CTA per 16-query tile looping over key tiles. Each output is
// written once by one thread, sums in a fixed order, no atomics: deterministic.
// Dropout (p_drop > 0, the forward's keep bits, attention.cu): with m_ij = keep_ij * drop_scale,
// dv_j = sum_i m_ij P_ij dout_i and dS_ij = P_ij (m_ij dP_ij - delta_i); delta is unchanged
// (the forward's o already holds the dropped probabilities).
// Grouped-query attention: k, v, dk, dv hold B / kv_group entries; query entry b reads K/V
// entry b / kv_group, and dk/dv of K/V entry c sum over query entries c * kv_group ..
// (c + 1) * kv_group - 1: the dk/dv CTA of a key tile loops over them in order (registers,
// no atomics), so the reduction over a group is deterministic too.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_rows.cuh"
#include "gpuplan_philox.cuh"

namespace attn {
using gp::exp_;
using gp::neg_inf;

constexpr int WARPS = 4, ROWS = 4, THREADS = 32 * WARPS;
constexpr int BO = WARPS * ROWS;  // rows owned by a CTA (keys for dk/dv, queries for dq)
constexpr int BS = 32;            // streamed rows per tile, one per lane
// Launch bounds' blocks per SM: a 128 (f64: 255) register cap. Without one, ptxas for sm_90
// picks ~56 registers and spills.
template <typename T>
constexpr int MIN_BLOCKS = sizeof(typename gp::acc_type<T>::type) == 8 ? 2 : 4;

// delta[r] = sum_c dout[r, c] * o[r, c] in A; one row per warp.
template <typename T>
__global__ void __launch_bounds__(THREADS, 4)
attention_backward_delta(const T* __restrict__ o, const T* __restrict__ dout,
                         typename gp::acc_type<T>::type* __restrict__ delta, long long rows,
                         long long d) {
    using A = typename gp::acc_type<T>::type;
    const int lane = threadIdx.x & 31;
    const long long step = static_cast<long long>(gridDim.x) * WARPS;
    for (long long r = static_cast<long long>(blockIdx.x) * WARPS + (threadIdx.x >> 5); r < rows;
         r += step) {
        A s = A(0);
        for (long long c = lane; c < d; c += 32) {
            s = fma(gp::to_acc<T>(dout[r * d + c]), gp::to_acc<T>(o[r * d + c]), s);
        }
        s = gp::warp_sum(s);
        if (lane == 0) delta[r] = s;
    }
}

// s[r * ld + c] = g[(row0 + r) * d + c] for r < rows (0 past n_rows), c < d; coalesced.
template <typename T, typename A>
__device__ __forceinline__ void load_rows(A* __restrict__ s, int ld, const T* __restrict__ g,
                                          long long row0, int rows, long long n_rows, int d) {
    for (int e = threadIdx.x; e < rows * d; e += blockDim.x) {
        const int r = e / d, c = e - r * d;
        s[r * ld + c] = row0 + r < n_rows ? gp::to_acc<T>(g[(row0 + r) * d + c]) : A(0);
    }
}

// x[r] = dot(a + r * d, b) for the warp's ROWS rows of `a` (broadcast) against row `b`.
template <typename A>
__device__ __forceinline__ void dots(A (&x)[ROWS], const A* __restrict__ a,
                                     const A* __restrict__ b, int d) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) x[r] = A(0);
    for (int c = 0; c < d; ++c) {
        const A bv = b[c];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) x[r] = fma(a[r * d + c], bv, x[r]);
    }
}

// acc[r][c] += sum_l w[r * BS + l] * s[l * ld + lane + 32 c] (columns < d).
template <typename A, int C>
__device__ __forceinline__ void accumulate(A (&acc)[ROWS][C], const A* __restrict__ w,
                                           const A* __restrict__ s, int ld, int d, int lane) {
    for (int l = 0; l < BS; ++l) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int col = lane + 32 * c;
            const A sv = col < d ? s[l * ld + col] : A(0);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) acc[r][c] = fma(w[r * BS + l], sv, acc[r][c]);
        }
    }
}

template <typename T, typename A, int C>
__device__ __forceinline__ void store_rows(T* __restrict__ g, const A (&acc)[ROWS][C],
                                           long long row0, long long n_rows, int d, A mul,
                                           int lane) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        if (row0 + r >= n_rows) continue;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int col = lane + 32 * c;
            if (col < d) g[(row0 + r) * d + col] = gp::from_acc<T>(acc[r][c] * mul);
        }
    }
}

// One CTA per (16-key tile, K/V entry bkv): blockIdx.x = tile + k_tiles * bkv. Warp w owns
// keys k0 + 4w .. k0 + 4w + 3; for each query entry b of bkv's group in turn and each 32-query
// tile of it, a lane owns query i0 + lane for P and dS, then head-dim columns for dv and dk.
// Shared (A): K, V [16][D]; Q, dO [32][D + 1]; lse, delta [32]; P, dS [4 warps][4 keys][32].
template <typename T, int C>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS<T>)
attention_backward_dkdv_simt(const T* __restrict__ q, const T* __restrict__ k,
                             const T* __restrict__ v, const T* __restrict__ dout,
                             const typename gp::acc_type<T>::type* __restrict__ lse,
                             const typename gp::acc_type<T>::type* __restrict__ delta,
                             T* __restrict__ dk, T* __restrict__ dv, long long lq, long long lk,
                             long long dim, long long k_tiles, long long kv_group,
                             double scale, int causal,
                             unsigned long long seed, unsigned long long rng_offset,
                             float p_drop, typename gp::acc_type<T>::type drop_scale,
                             long long drop_group, long long drop_stride, long long drop_shift) {
    using A = typename gp::acc_type<T>::type;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int d = static_cast<int>(dim), tiles = static_cast<int>(k_tiles);
    A* sk = reinterpret_cast<A*>(smem_raw);
    A* sv = sk + BO * d;
    A* sq = sv + BO * d;
    A* sdo = sq + BS * (d + 1);
    A* slse = sdo + BS * (d + 1);
    A* sdelta = slse + BS;
    A* sp = sdelta + BS;
    A* sds = sp + BO * BS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long bkv = static_cast<int>(blockIdx.x) / tiles;  // the K/V entry
    const long long k0 = static_cast<long long>(static_cast<int>(blockIdx.x) % tiles) * BO;
    const long long offset = lk - lq;
    const A sc = static_cast<A>(scale);
    load_rows<T, A>(sk, d, k + bkv * lk * d, k0, BO, lk, d);
    load_rows<T, A>(sv, d, v + bkv * lk * d, k0, BO, lk, d);
    // Causal: query i sees key j iff j <= i + offset, so queries below k0 - offset see none.
    long long i_start = causal ? k0 - offset : 0;
    i_start = i_start < 0 ? 0 : i_start;

    A gk[ROWS][C], gv[ROWS][C];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c) gk[r][c] = gv[r][c] = A(0);
    const A* kw = sk + warp * ROWS * d;
    const A* vw = sv + warp * ROWS * d;
    A* pw = sp + warp * ROWS * BS;
    A* dsw = sds + warp * ROWS * BS;
    // The query entries of this K/V entry's group, in order.
    for (long long b = bkv * kv_group; b < (bkv + 1) * kv_group; ++b) {
        for (long long i0 = i_start; i0 < lq; i0 += BS) {
            __syncthreads();  // the previous query tile is consumed (and K, V are loaded)
            load_rows<T, A>(sq, d + 1, q + b * lq * d, i0, BS, lq, d);
            load_rows<T, A>(sdo, d + 1, dout + b * lq * d, i0, BS, lq, d);
            if (threadIdx.x < BS) {
                const long long i = i0 + threadIdx.x;
                slse[threadIdx.x] = i < lq ? lse[b * lq + i] : A(0);
                sdelta[threadIdx.x] = i < lq ? delta[b * lq + i] : A(0);
            }
            __syncthreads();
            A s[ROWS], dp[ROWS];
            dots(s, kw, sq + lane * (d + 1), d);
            dots(dp, vw, sdo + lane * (d + 1), d);
            const long long i = i0 + lane;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const long long j = k0 + warp * ROWS + r;
                const bool valid = i < lq && j < lk && (!causal || j <= i + offset);
                const A p = valid ? exp_(s[r] * sc - slse[lane]) : A(0);
                A mul = A(1);
                if (p_drop > 0.0f && p != A(0)) {
                    const long long eb = gp::drop_entry(b, drop_group, drop_stride, drop_shift);
                    const auto e = static_cast<unsigned long long>((eb * lq + i) * lk + j);
                    mul = gp::keep_one(e, seed, rng_offset, p_drop) ? drop_scale : A(0);
                }
                pw[r * BS + lane] = p * mul;
                dsw[r * BS + lane] = p * (dp[r] * mul - sdelta[lane]);
            }
            __syncwarp();
            accumulate<A, C>(gv, pw, sdo, d + 1, d, lane);
            accumulate<A, C>(gk, dsw, sq, d + 1, d, lane);
            __syncwarp();
        }
    }
    const long long j0 = k0 + warp * ROWS;
    store_rows<T, A, C>(dk + bkv * lk * d, gk, j0, lk, d, sc, lane);
    store_rows<T, A, C>(dv + bkv * lk * d, gv, j0, lk, d, A(1), lane);
}

// One CTA per (16-query tile, batch entry): blockIdx.x = tile + q_tiles * b. Warp w owns
// queries q0 + 4w .. q0 + 4w + 3; for each 32-key tile a lane owns key k0 + lane for dS, then
// head-dim columns for dq. Shared (A): Q, dO [16][D]; K, V [32][D + 1]; dS [4][4][32].
template <typename T, int C>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS<T>)
attention_backward_dq_simt(const T* __restrict__ q, const T* __restrict__ k,
                           const T* __restrict__ v, const T* __restrict__ dout,
                           const typename gp::acc_type<T>::type* __restrict__ lse,
                           const typename gp::acc_type<T>::type* __restrict__ delta,
                           T* __restrict__ dq, long long lq, long long lk, long long dim,
                           long long q_tiles, long long kv_group, double scale, int causal,
                           unsigned long long seed, unsigned long long rng_offset, float p_drop,
                           typename gp::acc_type<T>::type drop_scale,
                           long long drop_group, long long drop_stride, long long drop_shift) {
    using A = typename gp::acc_type<T>::type;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int d = static_cast<int>(dim), tiles = static_cast<int>(q_tiles);
    A* sq = reinterpret_cast<A*>(smem_raw);
    A* sdo = sq + BO * d;
    A* sk = sdo + BO * d;
    A* sv = sk + BS * (d + 1);
    A* sds = sv + BS * (d + 1);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long b = static_cast<int>(blockIdx.x) / tiles;
    const long long q0 = static_cast<long long>(static_cast<int>(blockIdx.x) % tiles) * BO;
    const long long offset = lk - lq;
    const A sc = static_cast<A>(scale);
    load_rows<T, A>(sq, d, q + b * lq * d, q0, BO, lq, d);
    load_rows<T, A>(sdo, d, dout + b * lq * d, q0, BO, lq, d);
    const long long bkv = b / kv_group;  // this query entry's K/V entry
    const T* kb = k + bkv * lk * d;
    const T* vb = v + bkv * lk * d;
    const long long iw = q0 + warp * ROWS;  // this warp's first query
    A lse_r[ROWS], delta_r[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        lse_r[r] = iw + r < lq ? lse[b * lq + iw + r] : A(0);
        delta_r[r] = iw + r < lq ? delta[b * lq + iw + r] : A(0);
    }
    long long kend = lk;
    if (causal) {
        const long long q1 = q0 + BO < lq ? q0 + BO : lq;
        kend = q1 + offset < 0 ? 0 : (q1 + offset < lk ? q1 + offset : lk);
    }

    A gq[ROWS][C];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c) gq[r][c] = A(0);
    const A* qw = sq + warp * ROWS * d;
    const A* dow = sdo + warp * ROWS * d;
    A* dsw = sds + warp * ROWS * BS;
    for (long long k0 = 0; k0 < kend; k0 += BS) {
        __syncthreads();
        load_rows<T, A>(sk, d + 1, kb, k0, BS, lk, d);
        load_rows<T, A>(sv, d + 1, vb, k0, BS, lk, d);
        __syncthreads();
        A s[ROWS], dp[ROWS];
        dots(s, qw, sk + lane * (d + 1), d);
        dots(dp, dow, sv + lane * (d + 1), d);
        const long long j = k0 + lane;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const long long i = iw + r;
            const bool valid = i < lq && j < lk && (!causal || j <= i + offset);
            const A p = valid ? exp_(s[r] * sc - lse_r[r]) : A(0);
            A mul = A(1);
            if (p_drop > 0.0f && p != A(0)) {
                const long long eb = gp::drop_entry(b, drop_group, drop_stride, drop_shift);
                const auto e = static_cast<unsigned long long>((eb * lq + i) * lk + j);
                mul = gp::keep_one(e, seed, rng_offset, p_drop) ? drop_scale : A(0);
            }
            dsw[r * BS + lane] = p * (dp[r] * mul - delta_r[r]);
        }
        __syncwarp();
        accumulate<A, C>(gq, dsw, sk, d + 1, d, lane);
        __syncwarp();
    }
    store_rows<T, A, C>(dq + b * lq * d, gq, iw, lq, d, sc, lane);
}

}  // namespace attn

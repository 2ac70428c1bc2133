// Fused attention forward: o = softmax(scale * q k^T [causal]) v and lse per query row, with
// an online softmax over K/V tiles streamed through shared memory (no [Lq, Lk] buffer).
// q, o: [B, Lq, D]; k, v: [B / kv_group, Lk, D]; lse: [B, Lq] in A (f32; f64 for f64). Key
// j is masked for query i when causal and j > i + (Lk - Lq); a row with every key masked gets
// o = 0 and lse = -inf. Grid: one CTA per (query tile, batch entry), blockIdx.x = tile +
// q_tiles * b. Every output is written by one thread, sums run in a fixed order:
// deterministic.
// Dropout (p_drop > 0) drops probability (i, j) of batch entry b with the Philox keep bit of
// flat element (e * Lq + i) * Lk + j under (seed, rng_offset) (gpuplan_philox.cuh), the mask
// the dropout plan draws over [B, Lq, Lk] probabilities: O = (P * keep * drop_scale) V,
// while lse is the undropped softmax's. e = drop_entry(b, drop_group, drop_stride,
// drop_shift): b itself, or for a tensor-parallel shard the entry of one process's batch.
// Grouped-query attention: k, v hold B / kv_group entries and query entry b reads entry
// b / kv_group (kv_group = 1: one K/V entry per query entry); K/V are never copied per head.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_rows.cuh"
#include "gpuplan_mma.cuh"
#include "gpuplan_philox.cuh"

namespace attn {
using gp::exp_;
using gp::log_;
using gp::neg_inf;

// Keys [0, end) can be unmasked for queries [q0, q1) (q1 <= lq): all of them unless causal.
__device__ __forceinline__ long long key_end(long long q1, long long lk, long long offset,
                                             int causal) {
    if (!causal) return lk;
    const long long e = q1 + offset;  // last query q1 - 1 sees keys <= q1 - 1 + offset
    return e < 0 ? 0 : (e < lk ? e : lk);
}

// ---------------------------------------------------------------------------------------
// SIMT kernel, any dtype, D <= 32 * C: 4 warps x 4 query rows per CTA, 32-key tiles. For S a
// lane owns one key (dot products against the broadcast q rows); for O it owns head-dim
// columns lane + 32 c. Shared (A elements): Q [16][D], K [32][D + 1] (odd stride: the lanes'
// rows fall in distinct banks), V [32][D], P [4 warps][4 rows][32].
constexpr int WARPS = 4, ROWS = 4, BQ = WARPS * ROWS, BK = 32, THREADS = 32 * WARPS;

template <typename T, typename A>
__device__ __forceinline__ void load_rows(A* __restrict__ s, int ld, const T* __restrict__ g,
                                          long long row0, int rows, long long n_rows, int d) {
    // s[r * ld + c] = g[(row0 + r) * d + c] for r < rows (0 past n_rows), c < d; coalesced.
    // In-tile indices are ints (rows * d <= 4096): no 64-bit division.
    for (int e = threadIdx.x; e < rows * d; e += blockDim.x) {
        const int r = e / d, c = e - r * d;
        s[r * ld + c] = row0 + r < n_rows ? gp::to_acc<T>(g[(row0 + r) * d + c]) : A(0);
    }
}

template <typename T, int C>
__global__ void __launch_bounds__(THREADS, 4)  // 128-register cap: ptxas spills without one
attention_forward_simt(const T* __restrict__ q, const T* __restrict__ k,
                       const T* __restrict__ v, T* __restrict__ o,
                       typename gp::acc_type<T>::type* __restrict__ lse, long long lq,
                       long long lk, long long dim, long long q_tiles, long long kv_group,
                       double scale, int causal, unsigned long long seed,
                       unsigned long long rng_offset,
                       float p_drop, typename gp::acc_type<T>::type drop_scale,
                       long long drop_group, long long drop_stride, long long drop_shift) {
    using A = typename gp::acc_type<T>::type;
    const int d = static_cast<int>(dim), tiles = static_cast<int>(q_tiles);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    A* sq = reinterpret_cast<A*>(smem_raw);
    A* sk = sq + BQ * d;
    A* sv = sk + BK * (d + 1);
    A* sp = sv + BK * d;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long b = static_cast<int>(blockIdx.x) / tiles;
    const long long q0 = static_cast<long long>(static_cast<int>(blockIdx.x) % tiles) * BQ;
    const long long offset = lk - lq;
    const A sc = static_cast<A>(scale);
    const long long bkv = b / kv_group;  // this query entry's K/V entry
    const T* kb = k + bkv * lk * d;
    const T* vb = v + bkv * lk * d;
    load_rows<T, A>(sq, d, q + b * lq * d, q0, BQ, lq, d);
    const long long q1 = q0 + BQ < lq ? q0 + BQ : lq;
    const long long kend = key_end(q1, lk, offset, causal);

    A m[ROWS], l[ROWS], acc[ROWS][C];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        m[r] = neg_inf<A>();
        l[r] = A(0);  // this lane's share of the row sum
#pragma unroll
        for (int c = 0; c < C; ++c) acc[r][c] = A(0);
    }
    const A* qw = sq + warp * ROWS * d;
    A* pw = sp + warp * ROWS * BK;
    for (long long k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads();  // the previous tile is consumed (and Q is loaded)
        load_rows<T, A>(sk, d + 1, kb, k0, BK, lk, d);
        load_rows<T, A>(sv, static_cast<int>(d), vb, k0, BK, lk, d);
        __syncthreads();
        A s[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) s[r] = A(0);
        const A* kr = sk + lane * (d + 1);
        for (int c = 0; c < d; ++c) {
            const A kv = kr[c];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) s[r] = fma(qw[r * d + c], kv, s[r]);
        }
        const long long j = k0 + lane;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const long long i = q0 + warp * ROWS + r;
            const bool valid = j < lk && (!causal || j <= i + offset);
            const A z = valid ? s[r] * sc : neg_inf<A>();
            const A mt = gp::warp_max(z);
            const A mn = mt > m[r] ? mt : m[r];
            A p = A(0), alpha = A(1);
            if (mn != neg_inf<A>()) {
                p = exp_(z - mn);
                alpha = exp_(m[r] - mn);
            }
            m[r] = mn;
            l[r] = l[r] * alpha + p;
#pragma unroll
            for (int c = 0; c < C; ++c) acc[r][c] *= alpha;
            if (p_drop > 0.0f && p != A(0)) {
                const long long eb = gp::drop_entry(b, drop_group, drop_stride, drop_shift);
                const auto e = static_cast<unsigned long long>((eb * lq + i) * lk + j);
                p = gp::keep_one(e, seed, rng_offset, p_drop) ? p * drop_scale : A(0);
            }
            pw[r * BK + lane] = p;
        }
        __syncwarp();
        for (int jj = 0; jj < BK; ++jj) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int col = lane + 32 * c;
                const A vv = col < d ? sv[jj * d + col] : A(0);
#pragma unroll
                for (int r = 0; r < ROWS; ++r) acc[r][c] = fma(pw[r * BK + jj], vv, acc[r][c]);
            }
        }
        __syncwarp();  // P is rewritten by the next tile
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const A total = gp::warp_sum(l[r]);
        const long long i = q0 + warp * ROWS + r;
        if (i >= lq) continue;
        const A inv = total > A(0) ? A(1) / total : A(0);
        T* orow = o + (b * lq + i) * d;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int col = lane + 32 * c;
            if (col < d) orow[col] = gp::from_acc<T>(acc[r][c] * inv);
        }
        if (lane == 0) lse[b * lq + i] = total > A(0) ? m[r] + log_(total) : neg_inf<A>();
    }
}

// ---------------------------------------------------------------------------------------
// Tensor-core kernel, f16/bf16, D = 64 or 128 (sm_80+): 4 warps per CTA, each owning R
// blocks of 16 query rows (R = 2 for D = 64, 1 for D = 128: TC_ROWS(D) rows per CTA), 64-key
// K/V tiles double-buffered (cp.async when VEC: 16-byte aligned bases), S = Q K^T and
// O += P V by mma.sync m16n8k16 with f32 accumulators; P stays in registers (C fragments
// repacked as A fragments). Each K or V fragment read from shared memory feeds the R row
// blocks' mma (FlashAttention-2's 32 rows per warp for D = 64): shared-memory traffic per
// mma halves; D = 128 keeps one block, its accumulators already fill the registers.
// Shared tiles are row-major with rows padded by 8 halves (ldmatrix rows in distinct banks):
// Q [TC_ROWS(D)][D + 8], then K and V [2][64][D + 8].
constexpr int TC_WARPS = 4, TC_BK = 64, TC_THREADS = 32 * TC_WARPS;
__host__ __device__ constexpr int tc_row_blocks(int d) { return d == 64 ? 2 : 1; }

// Copy rows [row0, row0 + ROWS) of a [n_rows, D] matrix into a padded shared tile (zeros past
// n_rows). VEC: 16-byte cp.async chunks (commit/wait by the caller); else plain copies.
template <typename T, int D, int ROWS, bool VEC>
__device__ __forceinline__ void tc_load(T* __restrict__ s, const T* __restrict__ g,
                                        long long row0, long long n_rows) {
    constexpr int LD = D + 8, CHUNKS = D / 8;
    if constexpr (VEC) {
        const unsigned base = gp::smem_addr(s);
        for (int e = threadIdx.x; e < ROWS * CHUNKS; e += blockDim.x) {
            const int r = e / CHUNKS, c = (e % CHUNKS) * 8;
            const bool valid = row0 + r < n_rows;
            const T* src = valid ? g + (row0 + r) * D + c : g;
            gp::cp_async16(base + 2u * (r * LD + c), src, valid);
        }
    } else {
        const T zero = gp::from_float<T>(0.0f);
        for (int e = threadIdx.x; e < ROWS * D; e += blockDim.x) {
            const int r = e / D, c = e % D;
            s[r * LD + c] = row0 + r < n_rows ? g[(row0 + r) * D + c] : zero;
        }
    }
}

template <typename T, int D, bool VEC>
__global__ void __launch_bounds__(TC_THREADS)
attention_forward_tc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     T* __restrict__ o, float* __restrict__ lse, long long lq, long long lk,
                     long long d, long long q_tiles, long long kv_group, double scale,
                     int causal, unsigned long long seed, unsigned long long rng_offset,
                     float p_drop, float drop_scale, long long drop_group,
                     long long drop_stride, long long drop_shift) {
    constexpr int R = tc_row_blocks(D), BQ = 16 * R * TC_WARPS;
    constexpr int LD = D + 8, KTILE = TC_BK * LD, NT = TC_BK / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sq = reinterpret_cast<T*>(smem_raw);
    T* sk = sq + BQ * LD;     // [2][TC_BK][LD]
    T* sv = sk + 2 * KTILE;   // [2][TC_BK][LD]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tiles = static_cast<int>(q_tiles);
    const long long b = static_cast<int>(blockIdx.x) / tiles;
    const long long q0 = static_cast<long long>(static_cast<int>(blockIdx.x) % tiles) * BQ;
    const long long offset = lk - lq;
    const float sc2 = static_cast<float>(scale * 1.4426950408889634);  // scale * log2(e)
    const long long eb = p_drop > 0.0f ? gp::drop_entry(b, drop_group, drop_stride, drop_shift)
                                       : 0;  // the dropout stream's batch entry
    const long long bkv = b / kv_group;  // this query entry's K/V entry
    const T* kb = k + bkv * lk * D;
    const T* vb = v + bkv * lk * D;
    const long long q1 = q0 + BQ < lq ? q0 + BQ : lq;
    const long long kend = key_end(q1, lk, offset, causal);
    const int n_tiles = static_cast<int>((kend + TC_BK - 1) / TC_BK);

    tc_load<T, D, BQ, VEC>(sq, q + b * lq * D, q0, lq);
    if (n_tiles > 0) {
        tc_load<T, D, TC_BK, VEC>(sk, kb, 0, lk);
        tc_load<T, D, TC_BK, VEC>(sv, vb, 0, lk);
    }
    gp::cp_async_commit();

    // Row block r of this warp: rows wrow + 16 r + g (h = 0) and + 8 (h = 1).
    const long long wrow = q0 + warp * 16 * R;
    float acc[R][DT][4], m[R][2], l[R][2];
    unsigned q_addr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int n = 0; n < DT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][n][e] = 0.0f;
        m[r][0] = m[r][1] = neg_inf<float>();
        l[r][0] = l[r][1] = 0.0f;  // this thread's share of the row's sum
        q_addr[r] = gp::smem_addr(sq) + 2u * gp::a_lane(lane, LD, (warp * R + r) * 16, 0);
    }

    for (int kt = 0; kt < n_tiles; ++kt) {
        const int buf = kt & 1;
        if (kt + 1 < n_tiles) {  // prefetch the next tile into the other buffer
            tc_load<T, D, TC_BK, VEC>(sk + (buf ^ 1) * KTILE, kb, (kt + 1) * TC_BK, lk);
            tc_load<T, D, TC_BK, VEC>(sv + (buf ^ 1) * KTILE, vb, (kt + 1) * TC_BK, lk);
            gp::cp_async_commit();
            gp::cp_async_wait<1>();
        } else {
            gp::cp_async_wait<0>();
        }
        __syncthreads();
        const unsigned k_base = gp::smem_addr(sk + buf * KTILE);
        const unsigned v_base = gp::smem_addr(sv + buf * KTILE);

        // A warp whose rows see none of this tile's keys (causal, above the diagonal)
        // skips it: its scores would all be masked (the barriers stay shared).
        const long long k0 = static_cast<long long>(kt) * TC_BK;
        const bool skip = causal && k0 > wrow + 16 * R - 1 + offset;
        if (!skip) {
            float s[R][NT][4];
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[r][n][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                unsigned af[R][4];
#pragma unroll
                for (int r = 0; r < R; ++r)
                    gp::ldmatrix_x4<false>(af[r], q_addr[r] + 2u * (kk * 16));
#pragma unroll
                for (int p = 0; p < NT / 2; ++p) {
                    unsigned bf[4];
                    gp::ldmatrix_x4<false>(bf, k_base + 2u * gp::b_lane(lane, LD, p * 16, kk * 16));
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        gp::Mma<T>::run(s[r][2 * p], af[r], bf[0], bf[1]);
                        gp::Mma<T>::run(s[r][2 * p + 1], af[r], bf[2], bf[3]);
                    }
                }
            }
            // Online softmax on rows g (e = 0, 1) and g + 8 (e = 2, 3) of each row block; a row's
            // 64 columns are spread over the 4 threads of a quad (shuffles with lane masks 1 and
            // 2). Scores are kept in the log2 domain (z = s * scale * log2(e), p = 2^(z - m)): one
            // multiply, a max, a subtract and an ex2 per score. Masks cost only on the tiles that
            // need them (the last key tile, and the tiles the causal diagonal crosses for this
            // warp's rows; warp-uniform), and then in 32-bit column arithmetic.
            const bool unmasked = k0 + TC_BK <= lk && (!causal || k0 + TC_BK - 1 <= wrow + offset);
#pragma unroll
            for (int rh = 0; rh < 2 * R; ++rh) {  // row block r = rh / 2, half h = rh % 2
                const int r = rh >> 1, h = rh & 1;
                const long long i = wrow + 16 * r + g + 8 * h;
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) s[r][n][2 * h + e] *= sc2;
                if (!unmasked) {  // columns > last are masked: last in [-1, TC_BK]
                    long long lim = lk - 1 - k0;
                    if (causal && i + offset - k0 < lim) lim = i + offset - k0;
                    const int last = lim < -1 ? -1 : (lim > TC_BK ? TC_BK : static_cast<int>(lim));
#pragma unroll
                    for (int n = 0; n < NT; ++n)
#pragma unroll
                        for (int e = 0; e < 2; ++e)
                            if (n * 8 + 2 * t + e > last) s[r][n][2 * h + e] = neg_inf<float>();
                }
                float mx = neg_inf<float>();
#pragma unroll
                for (int n = 0; n < NT; ++n)
                    mx = fmaxf(mx, fmaxf(s[r][n][2 * h], s[r][n][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mn = fmaxf(m[r][h], mx);
                // A row with no visible key yet subtracts 0: its scores are -inf, 2^-inf = 0.
                const float base = mn == neg_inf<float>() ? 0.0f : mn;
                const float alpha = exp2f(m[r][h] - base);
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float p = exp2f(s[r][n][2 * h + e] - base);
                        s[r][n][2 * h + e] = p;
                        sum += p;
                    }
                m[r][h] = mn;
                l[r][h] = l[r][h] * alpha + sum;
                if (p_drop > 0.0f) {  // O takes the dropped probabilities; l the undropped ones
                    const auto row = static_cast<unsigned long long>((eb * lq + i) * lk + k0);
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        bool keep0, keep1;
                        gp::keep_pair(row + n * 8 + 2 * t, seed, rng_offset, p_drop, keep0, keep1);
                        s[r][n][2 * h] = keep0 ? s[r][n][2 * h] * drop_scale : 0.0f;
                        s[r][n][2 * h + 1] = keep1 ? s[r][n][2 * h + 1] * drop_scale : 0.0f;
                    }
                }
#pragma unroll
                for (int n = 0; n < DT; ++n) {
                    acc[r][n][2 * h] *= alpha;
                    acc[r][n][2 * h + 1] *= alpha;
                }
            }
#pragma unroll
            for (int kk = 0; kk < TC_BK / 16; ++kk) {
                unsigned af[R][4];
#pragma unroll
                for (int r = 0; r < R; ++r) gp::c_to_a<T, NT>(af[r], s[r], kk);
#pragma unroll
                for (int p = 0; p < DT / 2; ++p) {
                    unsigned bf[4];
                    gp::ldmatrix_x4<true>(bf, v_base + 2u * gp::bt_lane(lane, LD, kk * 16, p * 16));
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        gp::Mma<T>::run(acc[r][2 * p], af[r], bf[0], bf[1]);
                        gp::Mma<T>::run(acc[r][2 * p + 1], af[r], bf[2], bf[3]);
                    }
                }
            }
        }
        __syncthreads();  // the next prefetch overwrites this tile's buffer
    }
    gp::cp_async_wait<0>();

#pragma unroll
    for (int rh = 0; rh < 2 * R; ++rh) {
        const int r = rh >> 1, h = rh & 1;
        float total = l[r][h];
        total += __shfl_xor_sync(0xffffffffu, total, 1);
        total += __shfl_xor_sync(0xffffffffu, total, 2);
        const long long i = wrow + 16 * r + g + 8 * h;
        if (i >= lq) continue;
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        T* orow = o + (b * lq + i) * D;
#pragma unroll
        for (int n = 0; n < DT; ++n) {
            orow[n * 8 + 2 * t] = gp::from_acc<T>(acc[r][n][2 * h] * inv);
            orow[n * 8 + 2 * t + 1] = gp::from_acc<T>(acc[r][n][2 * h + 1] * inv);
        }
        if (t == 0)  // m is in the log2 domain
            lse[b * lq + i] = total > 0.0f ? (m[r][h] + log2f(total)) * 0.6931471805599453f
                                           : neg_inf<float>();
    }
}

}  // namespace attn

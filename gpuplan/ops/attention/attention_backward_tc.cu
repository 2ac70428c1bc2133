// Fused attention backward on tensor cores (f16/bf16, D = 64 or 128, sm_80+): the math of
// attention_backward.cu (which also computes delta = rowsum(dout * o) first), with every
// product on mma.sync m16n8k16 and f32 accumulators. P and dS are rounded to T to feed the
// second mma of each pair from registers (C fragments repacked as A fragments).
//   dkdv: one CTA per (64-key tile, K/V entry), 16 keys per warp, over the BS-query tiles of
//         each query entry of the K/V entry's group in turn (grouped-query attention: query
//         entry b reads K/V entry b / kv_group; kv_group = 1: just entry b):
//         S^T = K Q^T, dP^T = V dO^T, P^T, dS^T elementwise, dV += P^T dO, dK += dS^T Q.
//   dq:   one CTA per (64-query tile, batch entry), 16 queries per warp, over 64-key tiles:
//         S = Q K^T, dP = dO V^T, dS elementwise, dQ += dS K.
// Streamed tiles are double-buffered (cp.async when VEC: 16-byte aligned bases). Shared
// tiles are row-major [rows][D + 8] (ldmatrix rows in distinct banks). Each output element
// is written once, sums in a fixed order, no atomics: deterministic. Dropout (p_drop > 0) as
// in attention_backward.cu: P scaled by keep * drop_scale for dV, dP by it inside dS.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_rows.cuh"
#include "gpuplan_mma.cuh"
#include "gpuplan_philox.cuh"

namespace attn {

constexpr int WARPS = 4, THREADS = 32 * WARPS, BO = 16 * WARPS;
constexpr float kLog2e = 1.4426950408889634f;  // P = 2^(S scale log2(e) - lse log2(e))

// Rows [row0, row0 + ROWS) of a [n_rows, D] matrix into a padded shared tile, zeros past
// n_rows (VEC: cp.async chunks, committed by the caller).
template <typename T, int D, int ROWS, bool VEC>
__device__ __forceinline__ void tile_load(T* __restrict__ s, const T* __restrict__ g,
                                          long long row0, long long n_rows) {
    constexpr int LD = D + 8, CHUNKS = D / 8;
    if constexpr (VEC) {
        const unsigned base = gp::smem_addr(s);
        for (int e = threadIdx.x; e < ROWS * CHUNKS; e += blockDim.x) {
            const int r = e / CHUNKS, c = (e % CHUNKS) * 8;
            const bool valid = row0 + r < n_rows;
            gp::cp_async16(base + 2u * (r * LD + c), valid ? g + (row0 + r) * D + c : g, valid);
        }
    } else {
        const T zero = gp::from_float<T>(0.0f);
        for (int e = threadIdx.x; e < ROWS * D; e += blockDim.x) {
            const int r = e / D, c = e % D;
            s[r * LD + c] = row0 + r < n_rows ? g[(row0 + r) * D + c] : zero;
        }
    }
}

template <int N>
__device__ __forceinline__ void zero(float (&a)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[n][e] = 0.0f;
}

// x += A y and z += A2 y2 for one warp's 16 rows: A, A2 row-major [16][D] at this lane's
// ldmatrix addresses a_addr / a2_addr; y, y2 stored [N * 8][D] (n-major: B^T row-major).
template <typename T, int D, int N>
__device__ __forceinline__ void mma_pair_nt(float (&x)[N][4], float (&z)[N][4], unsigned a_addr,
                                            unsigned a2_addr, unsigned y_base, unsigned y2_base,
                                            int lane) {
    constexpr int LD = D + 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        unsigned af[4], a2f[4];
        gp::ldmatrix_x4<false>(af, a_addr + 2u * (kk * 16));
        gp::ldmatrix_x4<false>(a2f, a2_addr + 2u * (kk * 16));
#pragma unroll
        for (int p = 0; p < N / 2; ++p) {
            const unsigned off = 2u * gp::b_lane(lane, LD, p * 16, kk * 16);
            unsigned bf[4];
            gp::ldmatrix_x4<false>(bf, y_base + off);
            gp::Mma<T>::run(x[2 * p], af, bf[0], bf[1]);
            gp::Mma<T>::run(x[2 * p + 1], af, bf[2], bf[3]);
            gp::ldmatrix_x4<false>(bf, y2_base + off);
            gp::Mma<T>::run(z[2 * p], a2f, bf[0], bf[1]);
            gp::Mma<T>::run(z[2 * p + 1], a2f, bf[2], bf[3]);
        }
    }
}

// acc += W Y: W [16][K] from C fragments w (K / 8 tiles), Y row-major [K][D] in shared.
template <typename T, int D, int NW>
__device__ __forceinline__ void mma_acc_nn(float (&acc)[D / 8][4], const float (&w)[NW][4],
                                           unsigned y_base, int lane) {
    constexpr int LD = D + 8;
#pragma unroll
    for (int kk = 0; kk < NW / 2; ++kk) {
        unsigned af[4];
        gp::c_to_a<T, NW>(af, w, kk);
#pragma unroll
        for (int p = 0; p < D / 16; ++p) {
            unsigned bf[4];
            gp::ldmatrix_x4<true>(bf, y_base + 2u * gp::bt_lane(lane, LD, kk * 16, p * 16));
            gp::Mma<T>::run(acc[2 * p], af, bf[0], bf[1]);
            gp::Mma<T>::run(acc[2 * p + 1], af, bf[2], bf[3]);
        }
    }
}

// Rows row0 + g and row0 + g + 8 of a [n_rows, D] output from C fragments, times mul.
template <typename T, int D>
__device__ __forceinline__ void store_frag(T* __restrict__ g_out, const float (&acc)[D / 8][4],
                                           long long row0, long long n_rows, float mul,
                                           int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const long long r = row0 + g + 8 * h;
        if (r >= n_rows) continue;
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                g_out[r * D + n * 8 + 2 * t + e] = gp::from_acc<T>(acc[n][2 * h + e] * mul);
    }
}

template <typename T, int D, bool VEC>
__global__ void __launch_bounds__(THREADS)
attention_backward_dkdv_tc(const T* __restrict__ q, const T* __restrict__ k,
                           const T* __restrict__ v, const T* __restrict__ dout,
                           const float* __restrict__ lse, const float* __restrict__ delta,
                           T* __restrict__ dk, T* __restrict__ dv, long long lq, long long lk,
                           long long d, long long k_tiles, long long kv_group, double scale,
                           int causal,
                           unsigned long long seed, unsigned long long rng_offset, float p_drop,
                           float drop_scale, long long drop_group, long long drop_stride,
                           long long drop_shift) {
    constexpr int LD = D + 8, BS = D == 128 ? 32 : 64, NT = BS / 8, DT = D / 8;
    constexpr int OWNED = BO * LD, STREAMED = BS * LD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sk = reinterpret_cast<T*>(smem_raw);
    T* sv = sk + OWNED;
    T* sq = sv + OWNED;          // [2][BS][LD]
    T* sdo = sq + 2 * STREAMED;  // [2][BS][LD]
    float* slse = reinterpret_cast<float*>(sdo + 2 * STREAMED);  // [2][BS]
    float* sdelta = slse + 2 * BS;                               // [2][BS]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tiles = static_cast<int>(k_tiles);
    const int bkv = static_cast<int>(blockIdx.x) / tiles;  // the K/V entry
    const long long k0 = static_cast<long long>(static_cast<int>(blockIdx.x) % tiles) * BO;
    const long long offset = lk - lq;
    const float sc = static_cast<float>(scale);
    const float sc2 = static_cast<float>(scale * 1.4426950408889634);  // scale * log2(e)
    const int group = static_cast<int>(kv_group);
    long long i_start = causal ? k0 - offset : 0;  // earlier queries see none of these keys
    i_start = i_start < 0 ? 0 : i_start;
    // Query tiles per query entry; iteration it takes tile it % n_tiles of the group's query
    // entry it / n_tiles (entries in order: a fixed summation order).
    const int n_tiles = i_start < lq ? static_cast<int>((lq - i_start + BS - 1) / BS) : 0;
    const int n_iters = n_tiles * group;

    auto load_stream = [&](int it, int buf) {
        const int e = it / n_tiles;
        const long long b = static_cast<long long>(bkv) * group + e;  // the query entry
        const long long i0 = i_start + static_cast<long long>(it - e * n_tiles) * BS;
        tile_load<T, D, BS, VEC>(sq + buf * STREAMED, q + b * lq * D, i0, lq);
        tile_load<T, D, BS, VEC>(sdo + buf * STREAMED, dout + b * lq * D, i0, lq);
        if (threadIdx.x < BS) {
            const long long i = i0 + threadIdx.x;
            slse[buf * BS + threadIdx.x] = i < lq ? lse[b * lq + i] * kLog2e : 0.0f;
            sdelta[buf * BS + threadIdx.x] = i < lq ? delta[b * lq + i] : 0.0f;
        }
    };
    tile_load<T, D, BO, VEC>(sk, k + bkv * lk * D, k0, lk);
    tile_load<T, D, BO, VEC>(sv, v + bkv * lk * D, k0, lk);
    if (n_iters > 0) load_stream(0, 0);
    gp::cp_async_commit();

    float gk[DT][4], gv[DT][4];
    zero(gk);
    zero(gv);
    const unsigned k_addr = gp::smem_addr(sk) + 2u * gp::a_lane(lane, LD, warp * 16, 0);
    const unsigned v_addr = gp::smem_addr(sv) + 2u * gp::a_lane(lane, LD, warp * 16, 0);
    const long long j_g = k0 + warp * 16 + g;  // keys j_g and j_g + 8
    for (int it = 0; it < n_iters; ++it) {
        const int buf = it & 1;
        if (it + 1 < n_iters) {
            load_stream(it + 1, buf ^ 1);
            gp::cp_async_commit();
            gp::cp_async_wait<1>();
        } else {
            gp::cp_async_wait<0>();
        }
        __syncthreads();
        const unsigned q_base = gp::smem_addr(sq + buf * STREAMED);
        const unsigned do_base = gp::smem_addr(sdo + buf * STREAMED);
        float s[NT][4], dp[NT][4];  // S^T and dP^T: [16 keys][BS queries]
        zero(s);
        zero(dp);
        mma_pair_nt<T, D, NT>(s, dp, k_addr, v_addr, q_base, do_base, lane);
        const int e_it = it / n_tiles;  // this tile's query entry of the group
        const long long i0 = i_start + static_cast<long long>(it - e_it * n_tiles) * BS;
        // P^T = 2^(S^T scale log2(e) - lse log2(e)) (slse holds lse log2(e)). Masks cost
        // only on tiles that need them (warp-uniform test): there, key row j sees the query
        // columns [lo, hi) of the tile.
        const long long jw = k0 + warp * 16;
        const bool unmasked =
            i0 + BS <= lq && jw + 15 < lk && (!causal || jw + 15 <= i0 + offset);
        int lo[2] = {0, 0}, hi[2] = {BS, BS};
        if (!unmasked) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const long long j = j_g + 8 * h;
                const long long a = causal ? j - offset - i0 : 0, z = j < lk ? lq - i0 : 0;
                lo[h] = a < 0 ? 0 : (a > BS ? BS : static_cast<int>(a));
                hi[h] = z < 0 ? 0 : (z > BS ? BS : static_cast<int>(z));
            }
        }
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = n * 8 + 2 * t + (e & 1);
                const float p = exp2f(s[n][e] * sc2 - slse[buf * BS + col]);
                s[n][e] = unmasked || (col >= lo[e >> 1] && col < hi[e >> 1]) ? p : 0.0f;
            }
        if (p_drop > 0.0f) {
            const long long eb = gp::drop_entry(static_cast<long long>(bkv) * group + e_it,
                                                drop_group, drop_stride, drop_shift);
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = n * 8 + 2 * t + (e & 1);
                    const long long i = i0 + col, j = j_g + 8 * (e >> 1);
                    const float p = s[n][e];
                    float mul = 1.0f;
                    if (p != 0.0f) {
                        const auto el = static_cast<unsigned long long>((eb * lq + i) * lk + j);
                        mul = gp::keep_one(el, seed, rng_offset, p_drop) ? drop_scale : 0.0f;
                    }
                    s[n][e] = p * mul;
                    dp[n][e] = p * (dp[n][e] * mul - sdelta[buf * BS + col]);
                }
        } else {
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dp[n][e] = s[n][e] * (dp[n][e] - sdelta[buf * BS + n * 8 + 2 * t + (e & 1)]);
        }
        mma_acc_nn<T, D, NT>(gv, s, do_base, lane);
        mma_acc_nn<T, D, NT>(gk, dp, q_base, lane);
        __syncthreads();  // the next prefetch overwrites this buffer
    }
    gp::cp_async_wait<0>();
    store_frag<T, D>(dk + bkv * lk * D, gk, k0 + warp * 16, lk, sc, lane);
    store_frag<T, D>(dv + bkv * lk * D, gv, k0 + warp * 16, lk, 1.0f, lane);
}

template <typename T, int D, bool VEC>
__global__ void __launch_bounds__(THREADS)
attention_backward_dq_tc(const T* __restrict__ q, const T* __restrict__ k,
                         const T* __restrict__ v, const T* __restrict__ dout,
                         const float* __restrict__ lse, const float* __restrict__ delta,
                         T* __restrict__ dq, long long lq, long long lk, long long d,
                         long long q_tiles, long long kv_group, double scale, int causal,
                         unsigned long long seed,
                         unsigned long long rng_offset, float p_drop, float drop_scale,
                         long long drop_group, long long drop_stride, long long drop_shift) {
    constexpr int LD = D + 8, BS = 64, NT = BS / 8, DT = D / 8;
    constexpr int OWNED = BO * LD, STREAMED = BS * LD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sq = reinterpret_cast<T*>(smem_raw);
    T* sdo = sq + OWNED;
    T* sk = sdo + OWNED;         // [2][BS][LD]
    T* sv = sk + 2 * STREAMED;   // [2][BS][LD]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tiles = static_cast<int>(q_tiles);
    const long long b = static_cast<int>(blockIdx.x) / tiles;
    const long long q0 = static_cast<long long>(static_cast<int>(blockIdx.x) % tiles) * BO;
    const long long offset = lk - lq;
    const float sc = static_cast<float>(scale);
    const float sc2 = static_cast<float>(scale * 1.4426950408889634);  // scale * log2(e)
    const long long eb = p_drop > 0.0f ? gp::drop_entry(b, drop_group, drop_stride, drop_shift)
                                       : 0;  // the dropout stream's batch entry
    const long long bkv = b / kv_group;  // this query entry's K/V entry
    const T* kb = k + bkv * lk * D;
    const T* vb = v + bkv * lk * D;
    const long long i_g = q0 + warp * 16 + g;  // queries i_g and i_g + 8
    float lse_h[2], delta_h[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const long long i = i_g + 8 * h;
        lse_h[h] = i < lq ? lse[b * lq + i] * kLog2e : 0.0f;  // log2 domain
        delta_h[h] = i < lq ? delta[b * lq + i] : 0.0f;
    }
    long long kend = lk;
    if (causal) {
        const long long q1 = q0 + BO < lq ? q0 + BO : lq;
        kend = q1 + offset < 0 ? 0 : (q1 + offset < lk ? q1 + offset : lk);
    }
    const int n_tiles = static_cast<int>((kend + BS - 1) / BS);

    tile_load<T, D, BO, VEC>(sq, q + b * lq * D, q0, lq);
    tile_load<T, D, BO, VEC>(sdo, dout + b * lq * D, q0, lq);
    if (n_tiles > 0) {
        tile_load<T, D, BS, VEC>(sk, kb, 0, lk);
        tile_load<T, D, BS, VEC>(sv, vb, 0, lk);
    }
    gp::cp_async_commit();

    float gq[DT][4];
    zero(gq);
    const unsigned q_addr = gp::smem_addr(sq) + 2u * gp::a_lane(lane, LD, warp * 16, 0);
    const unsigned do_addr = gp::smem_addr(sdo) + 2u * gp::a_lane(lane, LD, warp * 16, 0);
    for (int kt = 0; kt < n_tiles; ++kt) {
        const int buf = kt & 1;
        if (kt + 1 < n_tiles) {
            tile_load<T, D, BS, VEC>(sk + (buf ^ 1) * STREAMED, kb, (kt + 1) * BS, lk);
            tile_load<T, D, BS, VEC>(sv + (buf ^ 1) * STREAMED, vb, (kt + 1) * BS, lk);
            gp::cp_async_commit();
            gp::cp_async_wait<1>();
        } else {
            gp::cp_async_wait<0>();
        }
        __syncthreads();
        const unsigned k_base = gp::smem_addr(sk + buf * STREAMED);
        const unsigned v_base = gp::smem_addr(sv + buf * STREAMED);
        float s[NT][4], dp[NT][4];  // S and dP: [16 queries][BS keys]
        zero(s);
        zero(dp);
        mma_pair_nt<T, D, NT>(s, dp, q_addr, do_addr, k_base, v_base, lane);
        const long long k0 = static_cast<long long>(kt) * BS;
        // P = 2^(S scale log2(e) - lse log2(e)); masks only on the tiles that need them
        // (warp-uniform test): there, query row i sees the key columns <= last[h].
        const long long iw = q0 + warp * 16;
        const bool unmasked =
            k0 + BS <= lk && iw + 15 < lq && (!causal || k0 + BS - 1 <= iw + offset);
        int last[2] = {BS - 1, BS - 1};
        if (!unmasked) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const long long i = i_g + 8 * h;
                long long lim = i < lq ? lk - 1 - k0 : -1;
                if (causal && i + offset - k0 < lim) lim = i + offset - k0;
                last[h] = lim < -1 ? -1 : (lim > BS ? BS : static_cast<int>(lim));
            }
        }
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                bool keep[2] = {true, true};
                if (p_drop > 0.0f) {
                    const long long i = i_g + 8 * h, j0 = k0 + n * 8 + 2 * t;
                    const auto el = static_cast<unsigned long long>((eb * lq + i) * lk + j0);
                    gp::keep_pair(el, seed, rng_offset, p_drop, keep[0], keep[1]);
                }
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                    const int e = 2 * h + x;
                    float p = exp2f(s[n][e] * sc2 - lse_h[h]);
                    p = unmasked || n * 8 + 2 * t + x <= last[h] ? p : 0.0f;
                    const float mul = p_drop > 0.0f ? (keep[x] ? drop_scale : 0.0f) : 1.0f;
                    s[n][e] = p * (dp[n][e] * mul - delta_h[h]);
                }
            }
        mma_acc_nn<T, D, NT>(gq, s, k_base, lane);
        __syncthreads();
    }
    gp::cp_async_wait<0>();
    store_frag<T, D>(dq + b * lq * D, gq, q0 + warp * 16, lq, sc, lane);
}

}  // namespace attn

// Row-wise helpers shared by the softmax, cross-entropy and normalization kernels: row
// scheduling (one row per warp when WARP, else one row per block, rows walked grid-stride),
// row sums, and the online (running max, rescaled sum) log-sum-exp state.
#pragma once
#include "gpuplan_common.cuh"

namespace gp {

__device__ __forceinline__ float exp_(float v) { return expf(v); }
__device__ __forceinline__ double exp_(double v) { return ::exp(v); }
__device__ __forceinline__ float log_(float v) { return logf(v); }
__device__ __forceinline__ double log_(double v) { return ::log(v); }
template <typename A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double neg_inf<double>() {
    return -__longlong_as_double(0x7ff0000000000000LL);
}

template <bool WARP> __device__ __forceinline__ long long row_first() {
    if constexpr (WARP) {
        return static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    } else {
        return static_cast<long long>(blockIdx.x);
    }
}
template <bool WARP> __device__ __forceinline__ long long row_step() {
    if constexpr (WARP) {
        return static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
    } else {
        return static_cast<long long>(gridDim.x);
    }
}
template <bool WARP> __device__ __forceinline__ int row_lane() {
    return WARP ? static_cast<int>(threadIdx.x & 31) : static_cast<int>(threadIdx.x);
}
template <bool WARP> __device__ __forceinline__ int row_width() {
    return WARP ? 32 : static_cast<int>(blockDim.x);
}
template <bool WARP, typename A> __device__ __forceinline__ A row_sum(A v, A* smem) {
    if constexpr (WARP) {
        return gp::warp_sum(v);
    } else {
        return gp::block_sum(v, smem);
    }
}

// (m, s) is a running max and the sum of exp(z - m) of the values seen; m = -inf, s = 0
// is the empty state. -inf values add nothing; NaN propagates into s.
template <typename A> __device__ __forceinline__ void online_add(A& m, A& s, A z) {
    if (z > m) {
        s = s * exp_(m - z) + A(1);
        m = z;
    } else if (!(z == neg_inf<A>())) {
        s += exp_(z - m);
    }
}
template <typename A> __device__ __forceinline__ void online_merge(A& m, A& s, A m2, A s2) {
    const A mx = m > m2 ? m : m2;
    const A a = (m == neg_inf<A>()) ? A(0) : s * exp_(m - mx);
    const A b = (m2 == neg_inf<A>()) ? A(0) : s2 * exp_(m2 - mx);
    m = mx;
    s = a + b;
}
// Merge (m, s) over the threads sharing a row; every one of them gets the result.
// smem holds 64 A's. Symmetric merges make every lane's result bit-identical.
template <bool WARP, typename A> __device__ void row_online(A& m, A& s, A* smem) {
    for (int o = 16; o > 0; o >>= 1) {
        const A m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const A s2 = __shfl_xor_sync(0xffffffffu, s, o);
        online_merge(m, s, m2, s2);
    }
    if constexpr (!WARP) {
        const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
        const int nw = (blockDim.x + 31) >> 5;
        __syncthreads();  // earlier readers of smem are done
        if (lane == 0) {
            smem[wid] = m;
            smem[32 + wid] = s;
        }
        __syncthreads();
        if (wid == 0) {
            A mm = lane < nw ? smem[lane] : neg_inf<A>();
            A ss = lane < nw ? smem[32 + lane] : A(0);
            for (int o = 16; o > 0; o >>= 1) {
                const A m2 = __shfl_xor_sync(0xffffffffu, mm, o);
                const A s2 = __shfl_xor_sync(0xffffffffu, ss, o);
                online_merge(mm, ss, m2, s2);
            }
            if (lane == 0) {
                smem[0] = mm;
                smem[32] = ss;
            }
        }
        __syncthreads();
        m = smem[0];
        s = smem[32];
    }
}

}  // namespace gp

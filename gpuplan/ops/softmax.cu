// Softmax / log-softmax over the last axis (forward and backward), optional scale and
// causal mask. T: float, double, __half, __nv_bfloat16; A = gp::acc_type<T>.
// WARP: one row per warp, else one row per block (rows of any length: columns are looped).
// LOG selects log-softmax. Forward is single-pass online (running max and rescaled sum),
// then one write pass.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_common.cuh"

namespace {

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

}  // namespace

// z = scale * x; softmax: y = exp(z - max) / sum exp(z - max); log: y = z - max - log(sum).
// Causal (q_len > 0): row r is query i = r % q_len, and columns j > i + causal_offset are
// masked (softmax 0, log-softmax -inf); a row with every column masked is all masked.
template <typename T, bool LOG, bool WARP>
__global__ void softmax_forward(const T* __restrict__ x, T* __restrict__ y, long long rows,
                                long long cols, double scale, long long q_len,
                                long long causal_offset) {
    using A = typename gp::acc_type<T>::type;
    __shared__ A smem[64];
    const int lane = row_lane<WARP>(), width = row_width<WARP>();
    const A sc = static_cast<A>(scale);
    for (long long r = row_first<WARP>(); r < rows; r += row_step<WARP>()) {
        long long valid = cols;
        if (q_len > 0) {
            const long long lim = (r % q_len) + causal_offset + 1;
            valid = lim < 0 ? 0 : (lim < cols ? lim : cols);
        }
        const T* xr = x + r * cols;
        A m = neg_inf<A>(), s = A(0);
        for (long long j = lane; j < valid; j += width) online_add(m, s, sc * gp::to_acc<T>(xr[j]));
        row_online<WARP>(m, s, smem);
        T* yr = y + r * cols;
        if constexpr (LOG) {
            const A shift = m + log_(s);
            for (long long j = lane; j < cols; j += width) {
                yr[j] = gp::from_acc<T>(j < valid ? sc * gp::to_acc<T>(xr[j]) - shift
                                                  : neg_inf<A>());
            }
        } else {
            const A inv = A(1) / s;
            for (long long j = lane; j < cols; j += width) {
                yr[j] = gp::from_acc<T>(j < valid ? exp_(sc * gp::to_acc<T>(xr[j]) - m) * inv
                                                  : A(0));
            }
        }
    }
}

// softmax:     dx = scale * y * (dy - sum_j dy_j * y_j)
// log-softmax: dx = scale * (dy - exp(y) * sum_j dy_j)
template <typename T, bool LOG, bool WARP>
__global__ void softmax_backward(const T* __restrict__ y, const T* __restrict__ dy,
                                 T* __restrict__ dx, long long rows, long long cols,
                                 double scale) {
    using A = typename gp::acc_type<T>::type;
    __shared__ A smem[32];
    const int lane = row_lane<WARP>(), width = row_width<WARP>();
    const A sc = static_cast<A>(scale);
    for (long long r = row_first<WARP>(); r < rows; r += row_step<WARP>()) {
        const T* yr = y + r * cols;
        const T* dyr = dy + r * cols;
        A acc = A(0);
        for (long long j = lane; j < cols; j += width) {
            const A g = gp::to_acc<T>(dyr[j]);
            acc += LOG ? g : g * gp::to_acc<T>(yr[j]);
        }
        const A dot = row_sum<WARP>(acc, smem);
        T* dxr = dx + r * cols;
        for (long long j = lane; j < cols; j += width) {
            const A yv = gp::to_acc<T>(yr[j]);
            const A g = gp::to_acc<T>(dyr[j]);
            dxr[j] = gp::from_acc<T>(LOG ? sc * (g - exp_(yv) * dot) : sc * yv * (g - dot));
        }
    }
}

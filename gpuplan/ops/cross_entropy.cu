// Fused log-softmax + NLL (with label smoothing) over a vocabulary, and its gradient.
// T: float, double, __half, __nv_bfloat16 (logits); A = gp::acc_type<T>; I: int, long long.
// WARP: one row per warp, else one row per block; columns are looped (any vocabulary size).
// The device never reads logits[n, t] for a target t outside [0, V): such rows get NaN.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_rows.cuh"

namespace {
using gp::exp_;
using gp::log_;
using gp::neg_inf;
using gp::row_first;
using gp::row_step;
using gp::row_lane;
using gp::row_width;
using gp::row_sum;
using gp::online_add;
using gp::online_merge;
using gp::row_online;

template <typename A> __device__ __forceinline__ A quiet_nan();
template <> __device__ __forceinline__ float quiet_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double quiet_nan<double>() {
    return __longlong_as_double(0x7ff8000000000000LL);
}
}  // namespace

// Per row n: lse[n] = log sum_j exp(x[n, j]); with t = target[n] and e = smoothing,
//   row_loss[n] = (1 - e) * (lse - x[n, t]) + e * (lse - mean_j x[n, j])
// 0 when t == ignore_index, NaN when t is outside [0, V).
template <typename T, typename I, bool WARP>
__global__ void ce_forward(const T* __restrict__ logits, const I* __restrict__ target,
                           typename gp::acc_type<T>::type* __restrict__ row_loss,
                           typename gp::acc_type<T>::type* __restrict__ lse_out, long long n_rows,
                           long long vocab, long long ignore_index, double smoothing) {
    using A = typename gp::acc_type<T>::type;
    __shared__ A smem[64];
    const int lane = row_lane<WARP>(), width = row_width<WARP>();
    const A e = static_cast<A>(smoothing);
    for (long long r = row_first<WARP>(); r < n_rows; r += row_step<WARP>()) {
        const T* xr = logits + r * vocab;
        A m = neg_inf<A>(), s = A(0), sx = A(0);
        for (long long j = lane; j < vocab; j += width) {
            const A z = gp::to_acc<T>(xr[j]);
            online_add(m, s, z);
            sx += z;
        }
        row_online<WARP>(m, s, smem);
        if (smoothing != 0.0) sx = row_sum<WARP>(sx, smem);
        if (lane == 0) {
            const A lse = m + log_(s);
            lse_out[r] = lse;
            const long long t = static_cast<long long>(target[r]);
            A loss;
            if (t == ignore_index) {
                loss = A(0);
            } else if (t < 0 || t >= vocab) {
                loss = quiet_nan<A>();
            } else {
                loss = (A(1) - e) * (lse - gp::to_acc<T>(xr[t]));
                if (smoothing != 0.0) loss += e * (lse - sx / static_cast<A>(vocab));
            }
            row_loss[r] = loss;
        }
    }
}

// out[0] = sum_n row_loss[n] (sum) or that sum / #{n : target[n] != ignore_index} (mean),
// launched as ONE block: fixed per-thread strides and a fixed tree, so deterministic.
template <typename A, typename I>
__global__ void ce_reduce(const A* __restrict__ row_loss, const I* __restrict__ target,
                          A* __restrict__ out, long long n_rows, long long ignore_index,
                          int mean) {
    __shared__ A smem[32];
    __shared__ long long cmem[32];
    A s = A(0);
    long long c = 0;
    for (long long i = threadIdx.x; i < n_rows; i += blockDim.x) {
        s += row_loss[i];
        c += static_cast<long long>(target[i]) != ignore_index ? 1 : 0;
    }
    s = gp::block_sum(s, smem);
    c = gp::block_sum(c, cmem);
    if (threadIdx.x == 0) out[0] = mean ? s / static_cast<A>(c) : s;
}

// count[0] = #{n : target[n] != ignore_index}, launched as ONE block.
template <typename I>
__global__ void ce_count(const I* __restrict__ target, long long* __restrict__ count,
                         long long n_rows, long long ignore_index) {
    __shared__ long long cmem[32];
    long long c = 0;
    for (long long i = threadIdx.x; i < n_rows; i += blockDim.x) {
        c += static_cast<long long>(target[i]) != ignore_index ? 1 : 0;
    }
    c = gp::block_sum(c, cmem);
    if (threadIdx.x == 0) count[0] = c;
}

// dlogits[n, j] = g_n * (exp(x[n, j] - lse[n]) - e / V - (j == t ? 1 - e : 0)), where
// g_n = dloss[n] (per_row) or dloss[0], divided by count[0] when count is given (mean).
// Rows with t == ignore_index get 0; rows with t outside [0, V) get NaN.
template <typename T, typename I>
__global__ void ce_backward(const T* __restrict__ logits, const I* __restrict__ target,
                            const typename gp::acc_type<T>::type* __restrict__ lse,
                            const typename gp::acc_type<T>::type* __restrict__ dloss,
                            const long long* __restrict__ count, T* __restrict__ dlogits,
                            long long n_rows, long long vocab, long long ignore_index,
                            double smoothing, int per_row) {
    using A = typename gp::acc_type<T>::type;
    const A e = static_cast<A>(smoothing);
    const A off = vocab > 0 ? e / static_cast<A>(vocab) : A(0);
    const A hit = A(1) - e;
    for (long long r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const long long t = static_cast<long long>(target[r]);
        T* out = dlogits + r * vocab;
        if (t == ignore_index) {
            for (long long j = threadIdx.x; j < vocab; j += blockDim.x) out[j] = gp::from_acc<T>(A(0));
            continue;
        }
        A g = per_row ? dloss[r] : dloss[0];
        if (count != nullptr) g /= static_cast<A>(count[0]);
        if (t < 0 || t >= vocab) g = quiet_nan<A>();
        const A l = lse[r];
        const T* xr = logits + r * vocab;
        for (long long j = threadIdx.x; j < vocab; j += blockDim.x) {
            const A p = exp_(gp::to_acc<T>(xr[j]) - l);
            out[j] = gp::from_acc<T>(g * (p - off - (j == t ? hit : A(0))));
        }
    }
}

// Fused log-softmax + NLL (with label smoothing) over a vocabulary, its gradient, and the
// vocabulary-parallel stages (a rank holds the columns [vocab_start, vocab_start + V) of
// a vocab_total-wide row): local row max, local exp-sum and target logit, the loss from
// the all-reduced statistics. T: float, double, __half, __nv_bfloat16 (logits);
// A = gp::acc_type<T>; I: int, long long. WARP: one row per warp, else one row per block;
// columns are looped (any vocabulary size). A target outside [0, vocab_total) that is not
// ignore_index gives NaN (the device never reads logits out of bounds).
//
// The enumerators of `Reduction` come from the Python table (gpuplan/ops/cross_entropy/plans.py,
// REDUCTIONS) through -DGPUPLAN_ENUM_Reduction: an instantiated reduction without a branch
// below fails to compile (the static_asserts).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_map.cuh"
#include "gpuplan_rows.cuh"

namespace {
using gp::exp_;
using gp::log_;
using gp::neg_inf;
using gp::online_add;
using gp::row_first;
using gp::row_lane;
using gp::row_online;
using gp::row_step;
using gp::row_sum;
using gp::row_width;

enum Reduction { GPUPLAN_ENUM_Reduction };

template <int RED> constexpr bool unknown_reduction = RED < 0;

template <typename A> __device__ __forceinline__ A quiet_nan();
template <> __device__ __forceinline__ float quiet_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double quiet_nan<double>() {
    return __longlong_as_double(0x7ff8000000000000LL);
}

// The reduced loss from the sum of the row losses and the non-ignored row count.
template <int RED, typename A> __device__ __forceinline__ A reduce_loss(A sum, long long count) {
    if constexpr (RED == MEAN) {
        return sum / static_cast<A>(count);
    } else if constexpr (RED == SUM) {
        return sum;
    } else {
        static_assert(unknown_reduction<RED>, "reduction without CUDA forward math");
        return sum;
    }
}

// g_n, the gradient of the reduced loss with respect to row n's loss.
template <int RED, typename A>
__device__ __forceinline__ A row_weight(const A* dloss, const long long* count, long long r) {
    if constexpr (RED == NONE) {
        return dloss[r];
    } else if constexpr (RED == MEAN) {
        return dloss[0] / static_cast<A>(count[0]);
    } else if constexpr (RED == SUM) {
        return dloss[0];
    } else {
        static_assert(unknown_reduction<RED>, "reduction without CUDA backward math");
        return dloss[0];
    }
}

// NaN-propagating max (NumPy semantics).
template <typename A> __device__ __forceinline__ A nan_max(A a, A b) {
    return (a != a || a > b) ? a : (b != b ? b : (b > a ? b : a));
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

// out[0] = reduce_loss<RED>(sum_n row_loss[n], #{n : target[n] != ignore_index}),
// launched as ONE block: fixed per-thread strides and a fixed tree, so deterministic.
template <typename A, typename I, int RED>
__global__ void ce_reduce(const A* __restrict__ row_loss, const I* __restrict__ target,
                          A* __restrict__ out, long long n_rows, long long ignore_index) {
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
    if (threadIdx.x == 0) out[0] = reduce_loss<RED>(s, c);
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

// Over the block [vocab_start, vocab_start + V) of rows vocab_total wide (the dense case:
// 0 and V), with k = t - vocab_start and g_n = row_weight<RED>:
//   dlogits[n, j] = g_n * (exp(x[n, j] - lse[n]) - e / vocab_total - (j == k ? 1 - e : 0))
// Rows with t == ignore_index get 0; rows with t outside [0, vocab_total) get NaN.
template <typename T, typename I, int RED>
__global__ void ce_backward(const T* __restrict__ logits, const I* __restrict__ target,
                            const typename gp::acc_type<T>::type* __restrict__ lse,
                            const typename gp::acc_type<T>::type* __restrict__ dloss,
                            const long long* __restrict__ count, T* __restrict__ dlogits,
                            long long n_rows, long long vocab, long long vocab_start,
                            long long vocab_total, long long ignore_index, double smoothing) {
    using A = typename gp::acc_type<T>::type;
    const A e = static_cast<A>(smoothing);
    const A off = e / static_cast<A>(vocab_total);
    const A hit = A(1) - e;
    for (long long r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const long long t = static_cast<long long>(target[r]);
        T* out = dlogits + r * vocab;
        if (t == ignore_index) {
            for (long long j = threadIdx.x; j < vocab; j += blockDim.x) out[j] = gp::from_acc<T>(A(0));
            continue;
        }
        A g = row_weight<RED>(dloss, count, r);
        if (t < 0 || t >= vocab_total) g = quiet_nan<A>();
        const long long k = t - vocab_start;
        const A l = lse[r];
        const T* xr = logits + r * vocab;
        for (long long j = threadIdx.x; j < vocab; j += blockDim.x) {
            const A p = exp_(gp::to_acc<T>(xr[j]) - l);
            out[j] = gp::from_acc<T>(g * (p - off - (j == k ? hit : A(0))));
        }
    }
}

// Vocabulary-parallel stage 1: row_max[n] = max_j x[n, j] (NaN-propagating; -inf for an
// empty block). One row per block.
template <typename T>
__global__ void ce_partial_max(const T* __restrict__ logits,
                               typename gp::acc_type<T>::type* __restrict__ row_max,
                               long long n_rows, long long vocab) {
    using A = typename gp::acc_type<T>::type;
    __shared__ A smem[32];
    for (long long r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const T* xr = logits + r * vocab;
        A m = neg_inf<A>();
        for (long long j = threadIdx.x; j < vocab; j += blockDim.x) {
            m = nan_max(m, gp::to_acc<T>(xr[j]));
        }
        for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
        const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
        const int nw = (blockDim.x + 31) >> 5;
        __syncthreads();  // the previous row's readers of smem are done
        if (lane == 0) smem[wid] = m;
        __syncthreads();
        if (wid == 0) {
            A b = lane < nw ? smem[lane] : neg_inf<A>();
            for (int o = 16; o > 0; o >>= 1) b = nan_max(b, __shfl_xor_sync(0xffffffffu, b, o));
            if (lane == 0) row_max[r] = b;
        }
    }
}

// Vocabulary-parallel stage 2, given the global row max m (all-reduced stage 1):
//   stats[0, n] = sum_j exp(x[n, j] - m[n]),
//   stats[1, n] = x[n, t - vocab_start] when t falls in this block, else 0.
// One row per block.
template <typename T, typename I>
__global__ void ce_partial(const T* __restrict__ logits, const I* __restrict__ target,
                           const typename gp::acc_type<T>::type* __restrict__ row_max,
                           typename gp::acc_type<T>::type* __restrict__ stats, long long n_rows,
                           long long vocab, long long vocab_start) {
    using A = typename gp::acc_type<T>::type;
    __shared__ A smem[32];
    for (long long r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const T* xr = logits + r * vocab;
        const A m = row_max[r];
        A s = A(0);
        for (long long j = threadIdx.x; j < vocab; j += blockDim.x) {
            s += exp_(gp::to_acc<T>(xr[j]) - m);
        }
        s = gp::block_sum(s, smem);
        if (threadIdx.x == 0) {
            const long long k = static_cast<long long>(target[r]) - vocab_start;
            stats[r] = s;
            stats[n_rows + r] = (k >= 0 && k < vocab) ? gp::to_acc<T>(xr[k]) : A(0);
        }
    }
}

// Vocabulary-parallel stage 3, from the all-reduced m and stats (sum-exp, target logit):
//   lse[n] = m[n] + log stats[0, n],  row_loss[n] = lse[n] - stats[1, n],
// 0 when t == ignore_index, NaN when t is outside [0, vocab_total). Grid-stride over rows.
template <typename A, typename I>
__global__ void ce_finish(const I* __restrict__ target, const A* __restrict__ row_max,
                          const A* __restrict__ stats, A* __restrict__ row_loss,
                          A* __restrict__ lse_out, long long n_rows, long long vocab_total,
                          long long ignore_index) {
    for (long long r = gp::thread_index(); r < n_rows; r += gp::grid_stride()) {
        const A lse = row_max[r] + log_(stats[r]);
        const long long t = static_cast<long long>(target[r]);
        lse_out[r] = lse;
        row_loss[r] = t == ignore_index ? A(0)
                      : (t < 0 || t >= vocab_total) ? quiet_nan<A>() : lse - stats[n_rows + r];
    }
}

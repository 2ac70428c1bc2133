// Softmax / log-softmax over the last axis (forward and backward), optional scale and
// causal mask. T: float, double, __half, __nv_bfloat16; A = gp::acc_type<T>.
// WARP: one row per warp, else one row per block (rows of any length: columns are looped).
// LOG selects log-softmax. Forward is single-pass online (running max and rescaled sum),
// then one write pass. Both directions take the causal mask (q_len > 0).
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

// Columns [0, valid) of row r are unmasked: all of them unless causal (q_len > 0), where
// row r is query i = r % q_len and column j is masked when j > i + causal_offset.
__device__ __forceinline__ long long unmasked(long long r, long long cols, long long q_len,
                                              long long causal_offset) {
    if (q_len == 0) return cols;
    const long long lim = (r % q_len) + causal_offset + 1;
    return lim < 0 ? 0 : (lim < cols ? lim : cols);
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
        const long long valid = unmasked(r, cols, q_len, causal_offset);
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
// Sums run over the unmasked columns only; masked columns (causal) get dx = 0.
template <typename T, bool LOG, bool WARP>
__global__ void softmax_backward(const T* __restrict__ y, const T* __restrict__ dy,
                                 T* __restrict__ dx, long long rows, long long cols,
                                 double scale, long long q_len, long long causal_offset) {
    using A = typename gp::acc_type<T>::type;
    __shared__ A smem[32];
    const int lane = row_lane<WARP>(), width = row_width<WARP>();
    const A sc = static_cast<A>(scale);
    for (long long r = row_first<WARP>(); r < rows; r += row_step<WARP>()) {
        const long long valid = unmasked(r, cols, q_len, causal_offset);
        const T* yr = y + r * cols;
        const T* dyr = dy + r * cols;
        A acc = A(0);
        for (long long j = lane; j < valid; j += width) {
            const A g = gp::to_acc<T>(dyr[j]);
            acc += LOG ? g : g * gp::to_acc<T>(yr[j]);
        }
        const A dot = row_sum<WARP>(acc, smem);
        T* dxr = dx + r * cols;
        for (long long j = lane; j < cols; j += width) {
            A d = A(0);
            if (j < valid) {
                const A yv = gp::to_acc<T>(yr[j]);
                const A g = gp::to_acc<T>(dyr[j]);
                d = LOG ? sc * (g - exp_(yv) * dot) : sc * yv * (g - dot);
            }
            dxr[j] = gp::from_acc<T>(d);
        }
    }
}

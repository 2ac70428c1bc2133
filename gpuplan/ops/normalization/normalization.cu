// LayerNorm and RMSNorm over the last axis: forward, input gradient, parameter gradients
// (the two parameter-gradient kernels live in gpuplan_norm.cuh, shared with residual_norm.cu).
// T: float, double, __half, __nv_bfloat16; A = gp::acc_type<T> (float for halves).
// RMS selects RMSNorm (no mean, no bias). WARP: one row per warp, else one row per block.
// Statistics (mean, rstd) are stored as A. Absent weight/bias pointers are null.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_norm.cuh"

namespace {

using gp::inv_sqrt;
using gp::row_first;
using gp::row_step;
using gp::row_lane;
using gp::row_width;
using gp::row_sum;

}  // namespace

// y = (x - mean) * rstd * w + b   (RMS: y = x * rstd * w), rstd = 1/sqrt(var + eps).
// Two passes for the statistics (mean, then centred sum of squares) keep the variance
// accurate when |mean| >> std; the re-reads of a row hit L1/L2.
template <typename T, bool RMS, bool WARP>
__global__ void norm_forward(const T* __restrict__ x, const T* __restrict__ w,
                             const T* __restrict__ b, T* __restrict__ y,
                             typename gp::acc_type<T>::type* __restrict__ mean_out,
                             typename gp::acc_type<T>::type* __restrict__ rstd_out,
                             long long rows, long long dim, double eps) {
    using A = typename gp::acc_type<T>::type;
    __shared__ A smem[32];
    const int lane = row_lane<WARP>(), width = row_width<WARP>();
    const A inv_dim = dim > 0 ? A(1) / static_cast<A>(dim) : A(0);
    for (long long r = row_first<WARP>(); r < rows; r += row_step<WARP>()) {
        const T* xr = x + r * dim;
        A mean = A(0);
        if constexpr (!RMS) {
            A s = A(0);
            for (long long d = lane; d < dim; d += width) s += gp::to_acc<T>(xr[d]);
            mean = row_sum<WARP>(s, smem) * inv_dim;
        }
        A q = A(0);
        for (long long d = lane; d < dim; d += width) {
            const A c = gp::to_acc<T>(xr[d]) - mean;
            q += c * c;
        }
        const A rstd = inv_sqrt(row_sum<WARP>(q, smem) * inv_dim + static_cast<A>(eps));
        T* yr = y + r * dim;
        for (long long d = lane; d < dim; d += width) {
            A v = (gp::to_acc<T>(xr[d]) - mean) * rstd;
            if (w != nullptr) v *= gp::to_acc<T>(w[d]);
            if (b != nullptr) v += gp::to_acc<T>(b[d]);
            yr[d] = gp::from_acc<T>(v);
        }
        if (lane == 0) {
            if (mean_out != nullptr) mean_out[r] = mean;
            rstd_out[r] = rstd;
        }
    }
}

// Input gradient. With g = dy * w (dy without weight) and xhat = (x - mean) * rstd:
//   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat))            (xhat = x * rstd)
template <typename T, bool RMS, bool WARP>
__global__ void norm_backward_dx(const T* __restrict__ dy, const T* __restrict__ x,
                                 const T* __restrict__ w,
                                 const typename gp::acc_type<T>::type* __restrict__ mean_in,
                                 const typename gp::acc_type<T>::type* __restrict__ rstd_in,
                                 T* __restrict__ dx, long long rows, long long dim) {
    using A = typename gp::acc_type<T>::type;
    __shared__ A smem[32];
    const int lane = row_lane<WARP>(), width = row_width<WARP>();
    const A inv_dim = dim > 0 ? A(1) / static_cast<A>(dim) : A(0);
    for (long long r = row_first<WARP>(); r < rows; r += row_step<WARP>()) {
        const T* xr = x + r * dim;
        const T* dyr = dy + r * dim;
        const A mean = RMS ? A(0) : mean_in[r];
        const A rstd = rstd_in[r];
        A sg = A(0), sgx = A(0);
        for (long long d = lane; d < dim; d += width) {
            A g = gp::to_acc<T>(dyr[d]);
            if (w != nullptr) g *= gp::to_acc<T>(w[d]);
            const A xhat = (gp::to_acc<T>(xr[d]) - mean) * rstd;
            sg += g;
            sgx += g * xhat;
        }
        const A mg = RMS ? A(0) : row_sum<WARP>(sg, smem) * inv_dim;
        const A mgx = row_sum<WARP>(sgx, smem) * inv_dim;
        T* dxr = dx + r * dim;
        for (long long d = lane; d < dim; d += width) {
            A g = gp::to_acc<T>(dyr[d]);
            if (w != nullptr) g *= gp::to_acc<T>(w[d]);
            const A xhat = (gp::to_acc<T>(xr[d]) - mean) * rstd;
            dxr[d] = gp::from_acc<T>(rstd * (g - mg - xhat * mgx));
        }
    }
}

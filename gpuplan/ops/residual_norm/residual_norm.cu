// Residual add + LayerNorm over the last axis. T: float, double, __half, __nv_bfloat16;
// A = gp::acc_type<T> (float for halves). WARP: one row per warp, else one row per block.
//   forward:  s = x + r (rounded to T and written: the next residual), then the LayerNorm
//             of s exactly as normalization.cu's norm_forward computes it (same passes,
//             same row sums): y = (s - mean) * rstd * w + b, mean and rstd stored as A.
//   backward: dx = LayerNorm's input gradient at s + ds, rounded once (ds: the gradient
//             reaching s from its other use, null when there is none); x and r both get dx.
//             dweight / dbias: gpuplan_norm.cuh's two-stage kernels over (dy, s).
// Absent weight/bias pointers are null.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_norm.cuh"

namespace {

using gp::inv_sqrt;
using gp::row_first;
using gp::row_lane;
using gp::row_step;
using gp::row_sum;
using gp::row_width;

}  // namespace

// Each lane re-reads only the elements of s it wrote itself (same d loop), so no barrier is
// needed between the passes.
template <typename T, bool WARP>
__global__ void residual_norm_forward(const T* __restrict__ x, const T* __restrict__ r,
                                      const T* __restrict__ w, const T* __restrict__ b,
                                      T* __restrict__ s, T* __restrict__ y,
                                      typename gp::acc_type<T>::type* __restrict__ mean_out,
                                      typename gp::acc_type<T>::type* __restrict__ rstd_out,
                                      long long rows, long long dim, double eps) {
    using A = typename gp::acc_type<T>::type;
    __shared__ A smem[32];
    const int lane = row_lane<WARP>(), width = row_width<WARP>();
    const A inv_dim = dim > 0 ? A(1) / static_cast<A>(dim) : A(0);
    for (long long row = row_first<WARP>(); row < rows; row += row_step<WARP>()) {
        const long long base = row * dim;
        T* sr = s + base;
        A sum = A(0);
        for (long long d = lane; d < dim; d += width) {
            const T v = gp::from_acc<T>(gp::to_acc<T>(x[base + d]) + gp::to_acc<T>(r[base + d]));
            sr[d] = v;
            sum += gp::to_acc<T>(v);
        }
        const A mean = row_sum<WARP>(sum, smem) * inv_dim;
        A q = A(0);
        for (long long d = lane; d < dim; d += width) {
            const A c = gp::to_acc<T>(sr[d]) - mean;
            q += c * c;
        }
        const A rstd = inv_sqrt(row_sum<WARP>(q, smem) * inv_dim + static_cast<A>(eps));
        T* yr = y + base;
        for (long long d = lane; d < dim; d += width) {
            A v = (gp::to_acc<T>(sr[d]) - mean) * rstd;
            if (w != nullptr) v *= gp::to_acc<T>(w[d]);
            if (b != nullptr) v += gp::to_acc<T>(b[d]);
            yr[d] = gp::from_acc<T>(v);
        }
        if (lane == 0) {
            mean_out[row] = mean;
            rstd_out[row] = rstd;
        }
    }
}

// With g = dy * w (dy without weight) and shat = (s - mean) * rstd:
//   dx = rstd * (g - mean(g) - shat * mean(g * shat)) + ds
template <typename T, bool WARP, typename A = typename gp::acc_type<T>::type>
__global__ void residual_norm_backward_dx(const T* __restrict__ dy, const T* __restrict__ s,
                                          const T* __restrict__ w, const A* __restrict__ mean_in,
                                          const A* __restrict__ rstd_in,
                                          const T* __restrict__ ds, T* __restrict__ dx,
                                          long long rows, long long dim) {
    __shared__ A smem[32];
    const int lane = row_lane<WARP>(), width = row_width<WARP>();
    const A inv_dim = dim > 0 ? A(1) / static_cast<A>(dim) : A(0);
    for (long long row = row_first<WARP>(); row < rows; row += row_step<WARP>()) {
        const long long base = row * dim;
        const A mean = mean_in[row], rstd = rstd_in[row];
        A sg = A(0), sgx = A(0);
        for (long long d = lane; d < dim; d += width) {
            A g = gp::to_acc<T>(dy[base + d]);
            if (w != nullptr) g *= gp::to_acc<T>(w[d]);
            const A shat = (gp::to_acc<T>(s[base + d]) - mean) * rstd;
            sg += g;
            sgx += g * shat;
        }
        const A mg = row_sum<WARP>(sg, smem) * inv_dim;
        const A mgx = row_sum<WARP>(sgx, smem) * inv_dim;
        for (long long d = lane; d < dim; d += width) {
            A g = gp::to_acc<T>(dy[base + d]);
            if (w != nullptr) g *= gp::to_acc<T>(w[d]);
            const A shat = (gp::to_acc<T>(s[base + d]) - mean) * rstd;
            A v = rstd * (g - mg - shat * mgx);
            if (ds != nullptr) v += gp::to_acc<T>(ds[base + d]);
            dx[base + d] = gp::from_acc<T>(v);
        }
    }
}

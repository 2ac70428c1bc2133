// Shared by the LayerNorm kernels (normalization.cu, residual_norm.cu): 1/sqrt in the
// accumulator type, and the deterministic two-stage parameter gradients of a LayerNorm
// (or RMSNorm) over rows of (dy, x) with the saved mean and rstd.
#pragma once
#include "gpuplan_rows.cuh"

namespace gp {

__device__ __forceinline__ float inv_sqrt(float v) { return 1.0f / sqrtf(v); }
__device__ __forceinline__ double inv_sqrt(double v) { return 1.0 / ::sqrt(v); }

}  // namespace gp

// Parameter gradients, stage 1 of 2 (deterministic, no atomics). Block (bx, g), launched as
// (NORM_PG_COLS, NORM_PG_ROWS) threads, owns columns bx*32 + tx of the row chunk
// [g*chunk, min(rows, (g+1)*chunk)); thread row ty sums rows ty, ty+8, ... of the chunk in
// order, then the 8 partial sums are added in ty order and written to
//   part_w[g*dim + d] = sum dy*xhat,   part_b[g*dim + d] = sum dy   (either may be null).
#define NORM_PG_COLS 32
#define NORM_PG_ROWS 8
template <typename T, bool RMS>
__global__ void norm_param_grad_partial(const T* __restrict__ dy, const T* __restrict__ x,
                                        const typename gp::acc_type<T>::type* __restrict__ mean_in,
                                        const typename gp::acc_type<T>::type* __restrict__ rstd_in,
                                        typename gp::acc_type<T>::type* __restrict__ part_w,
                                        typename gp::acc_type<T>::type* __restrict__ part_b,
                                        long long rows, long long dim, long long chunk) {
    using A = typename gp::acc_type<T>::type;
    __shared__ A sw[NORM_PG_ROWS][NORM_PG_COLS + 1];
    __shared__ A sb[NORM_PG_ROWS][NORM_PG_COLS + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const long long d = static_cast<long long>(blockIdx.x) * NORM_PG_COLS + tx;
    const long long g = blockIdx.y;
    const long long r0 = g * chunk;
    const long long r1 = (r0 + chunk < rows) ? r0 + chunk : rows;
    A aw = A(0), ab = A(0);
    if (d < dim) {
        for (long long r = r0 + ty; r < r1; r += NORM_PG_ROWS) {
            const A gy = gp::to_acc<T>(dy[r * dim + d]);
            const A mean = RMS ? A(0) : mean_in[r];
            const A xhat = (gp::to_acc<T>(x[r * dim + d]) - mean) * rstd_in[r];
            aw += gy * xhat;
            ab += gy;
        }
    }
    sw[ty][tx] = aw;
    sb[ty][tx] = ab;
    __syncthreads();
    if (ty == 0 && d < dim) {
        A tw = A(0), tb = A(0);
        for (int k = 0; k < NORM_PG_ROWS; ++k) {
            tw += sw[k][tx];
            tb += sb[k][tx];
        }
        if (part_w != nullptr) part_w[g * dim + d] = tw;
        if (part_b != nullptr) part_b[g * dim + d] = tb;
    }
}

// Stage 2: dweight[d] = sum_g part_w[g*dim + d] and dbias[d] = sum_g part_b[g*dim + d], in
// ascending g (fixed order). Outputs that are null are skipped. n_parts == 0 writes zeros.
template <typename T>
__global__ void norm_param_grad_final(const typename gp::acc_type<T>::type* __restrict__ part_w,
                                      const typename gp::acc_type<T>::type* __restrict__ part_b,
                                      T* __restrict__ dweight, T* __restrict__ dbias,
                                      long long n_parts, long long dim) {
    using A = typename gp::acc_type<T>::type;
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long d = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; d < dim;
         d += step) {
        if (dweight != nullptr) {
            A s = A(0);
            for (long long g = 0; g < n_parts; ++g) s += part_w[g * dim + d];
            dweight[d] = gp::from_acc<T>(s);
        }
        if (dbias != nullptr) {
            A s = A(0);
            for (long long g = 0; g < n_parts; ++g) s += part_b[g * dim + d];
            dbias[d] = gp::from_acc<T>(s);
        }
    }
}

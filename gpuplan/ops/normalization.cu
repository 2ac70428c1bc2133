// LayerNorm and RMSNorm over the last axis: forward, input gradient, parameter gradients.
// T: float, double, __half, __nv_bfloat16; A = gp::acc_type<T> (float for halves).
// RMS selects RMSNorm (no mean, no bias). WARP: one row per warp, else one row per block.
// Statistics (mean, rstd) are stored as A. Absent weight/bias pointers are null.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_rows.cuh"

namespace {

__device__ __forceinline__ float inv_sqrt(float v) { return 1.0f / sqrtf(v); }
__device__ __forceinline__ double inv_sqrt(double v) { return 1.0 / ::sqrt(v); }

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

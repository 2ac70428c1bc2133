// Dropout kernels driven by the counter-based Philox4x32-10 generator and keep rule of
// gpuplan_philox.cuh (identical to gpuplan/ops/dropout/plans.py, which reproduces these bits on the
// host). T: float, double, __half, __nv_bfloat16. One thread draws one counter and handles its
// four elements, so the generator runs once per four elements and the mask never depends on
// the launch shape.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_philox.cuh"

namespace {
using gp::keep_element;
using gp::Philox4;
using gp::philox4x32_10;

// Four consecutive elements moved with one (or, for double, two) vector memory operations.
template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
    T v[4];
};

}  // namespace

// y[i] = keep(i) ? x[i] * scale : 0 for i < n. Forward (x, y) and backward (dy, dx) alike.
// scale is float for f32/f16/bf16 (the product is taken in float, then rounded to nearest
// even) and double for f64. `aligned` != 0 promises x and y are aligned to 4 * sizeof(T).
template <typename T>
__global__ void dropout_apply(const T* __restrict__ x, T* __restrict__ y, long long n,
                              unsigned long long seed, unsigned long long offset, float p,
                              typename gp::acc_type<T>::type scale, int aligned) {
    using Acc = typename gp::acc_type<T>::type;
    const long long n_groups = (n + 3) / 4;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long g = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
         g < n_groups; g += stride) {
        const Philox4 r = philox4x32_10(offset + static_cast<unsigned long long>(g), seed);
        const long long base = 4 * g;
        if (aligned && base + 4 <= n) {
            const Vec4<T> in = reinterpret_cast<const Vec4<T>*>(x)[g];
            Vec4<T> out;
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                out.v[l] = keep_element(r.v[l], p) ? gp::from_acc<T>(gp::to_acc<T>(in.v[l]) * scale)
                                                   : gp::from_acc<T>(Acc(0));
            }
            reinterpret_cast<Vec4<T>*>(y)[g] = out;
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const long long i = base + l;
                if (i < n) {
                    y[i] = keep_element(r.v[l], p) ? gp::from_acc<T>(gp::to_acc<T>(x[i]) * scale)
                                                   : gp::from_acc<T>(Acc(0));
                }
            }
        }
    }
}

// mask[i] = keep(i) for i < n. `aligned` != 0 promises mask is aligned to 4 bytes.
__global__ void dropout_keep_mask(bool* __restrict__ mask, long long n, unsigned long long seed,
                                  unsigned long long offset, float p, int aligned) {
    const long long n_groups = (n + 3) / 4;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long g = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
         g < n_groups; g += stride) {
        const Philox4 r = philox4x32_10(offset + static_cast<unsigned long long>(g), seed);
        const long long base = 4 * g;
        if (aligned && base + 4 <= n) {
            Vec4<bool> out;
#pragma unroll
            for (int l = 0; l < 4; ++l) out.v[l] = keep_element(r.v[l], p);
            reinterpret_cast<Vec4<bool>*>(mask)[g] = out;
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                if (base + l < n) mask[base + l] = keep_element(r.v[l], p);
            }
        }
    }
}

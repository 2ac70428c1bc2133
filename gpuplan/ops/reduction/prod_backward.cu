// The gradient of a product along one dim (prod_backward.py).
// T: float, double, __half, __nv_bfloat16 (accumulated in gp::acc_type<T>).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_common.cuh"

// Gradient of y = prod(x[o, :, i]) along the middle dim: dx[o, r, i] = dy[o, i] times the
// product of the other elements. With no zero in the row that is p / x (p the product, in the
// accumulator type); with one zero, the zero's entry gets the product of the rest and every
// other entry 0; with two or more zeros, all 0. A thread per (o, i).
template <typename T>
__global__ void __launch_bounds__(256) prod_backward(const T* __restrict__ x, const T* __restrict__ dy,
                                                     T* __restrict__ dx, long long outer, long long R,
                                                     long long inner) {
    using A = typename gp::acc_type<T>::type;
    const long long n_out = outer * inner;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n_out; t += step) {
        const long long off = (t / inner) * R * inner + t % inner;
        A p = A(1);
        long long zeros = 0;
        for (long long r = 0; r < R; ++r) {
            const A v = gp::to_acc<T>(x[off + r * inner]);
            if (v == A(0)) {
                ++zeros;
            } else {
                p *= v;
            }
        }
        const A g = gp::to_acc<T>(dy[t]);
        for (long long r = 0; r < R; ++r) {
            const A v = gp::to_acc<T>(x[off + r * inner]);
            A d = A(0);
            if (zeros == 0) {
                d = g * (p / v);
            } else if (zeros == 1 && v == A(0)) {
                d = g * p;
            }
            dx[off + r * inner] = gp::from_acc<T>(d);
        }
    }
}

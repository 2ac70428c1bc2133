// Variance and standard deviation over a strided view of any axes (variance.py).
// T: float, double, __half, __nv_bfloat16 (accumulated in gp::acc_type<T>).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_common.cuh"

// Variance (STD: its square root) over a strided view: dims [0, nk) kept (output in C
// order), dims [nk, nk + nr) reduced, element strides st*. A thread per output makes two
// passes in C order of the reduced dims: mean = sum / n, then sum of (x - mean)^2, divided by
// max(0, n - correction) (the accurate two-pass formula; no cancellation of large squares).
template <typename T, int STD>
__global__ void __launch_bounds__(256) variance_general(const T* __restrict__ x, T* __restrict__ y,
                                                        long long n_out, long long n_red, int nk,
                                                        int nr, GP_DIMS_PARAMS(s),
                                                        GP_DIMS_PARAMS(st),
                                                        typename gp::acc_type<T>::type correction) {
    using A = typename gp::acc_type<T>::type;
    const long long shp[8] = GP_DIMS_ARRAY(s);
    const long long str[8] = GP_DIMS_ARRAY(st);
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < n_out; o += step) {
        const long long base = gp::kept_offset(o, nk, shp, str);
        A sums[2] = {A(0), A(0)};
        for (int pass = 0; pass < 2; ++pass) {
            const A mean = sums[0] / A(n_red);
            long long off = base;
            long long idx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (long long r = 0; r < n_red; ++r) {
                const A v = gp::to_acc<T>(x[off]);
                if (pass == 0) {
                    sums[0] += v;
                } else {
                    sums[1] += (v - mean) * (v - mean);
                }
                bool carry = true;  // odometer step over the reduced dims, last dim fastest
#pragma unroll
                for (int d = 7; d >= 0; --d) {
                    if (carry && d >= nk && d < nk + nr) {
                        off += str[d];
                        if (++idx[d] == shp[d]) {
                            idx[d] = 0;
                            off -= str[d] * shp[d];
                        } else {
                            carry = false;
                        }
                    }
                }
            }
        }
        const A dof = A(n_red) - correction;
        A var = sums[1] / (dof > A(0) ? dof : A(0));
        if constexpr (STD) var = sqrt(var);
        y[o] = gp::from_acc<T>(var);
    }
}

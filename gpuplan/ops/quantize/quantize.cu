// Per-token symmetric int8 quantization: quantize, dequantize and their backward kernels.
// T: float, double, __half, __nv_bfloat16.  C (compute type): float for f32/f16/bf16,
// double for f64.  Every f32 operand and result below FLT_MIN is flushed to a zero of the
// same sign explicitly, so the bits do not depend on -ftz and match the NumPy SKU exactly.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_common.cuh"

namespace gpq {

#define GPQ_FLT_MIN 1.17549435082228750797e-38f

__device__ __forceinline__ float ftz(float v) {
    return fabsf(v) < GPQ_FLT_MIN ? copysignf(0.0f, v) : v;
}
__device__ __forceinline__ double ftz(double v) { return v; }  // f64 keeps its subnormals

__device__ __forceinline__ float vmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double vmax(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float vmin(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double vmin(double a, double b) { return fmin(a, b); }
__device__ __forceinline__ float vabs(float a) { return fabsf(a); }
__device__ __forceinline__ double vabs(double a) { return fabs(a); }
__device__ __forceinline__ float vrint(float a) { return rintf(a); }  // round half to even
__device__ __forceinline__ double vrint(double a) { return rint(a); }

// scale = amax / 127 in C; below FLT_MIN (including the f32 underflow) it is 0.
__device__ __forceinline__ float scale_from_amax(float amax) {
    const float s = amax / 127.0f;
    return s < GPQ_FLT_MIN ? 0.0f : s;
}
__device__ __forceinline__ float scale_from_amax(double amax) {
    const double s = amax / 127.0;
    return s < static_cast<double>(GPQ_FLT_MIN) ? 0.0f : static_cast<float>(s);
}

// q = clamp(rint(x / s), -127, 127); NaN gives 0.  s > 0 (a zero scale is handled outside).
template <typename C>
__device__ __forceinline__ signed char quantize_one(C x, C s) {
    const C r = vrint(x / s);
    if (r != r) return 0;
    return static_cast<signed char>(static_cast<int>(vmin(vmax(r, C(-127)), C(127))));
}

}  // namespace gpq

// x [n_rows, D] -> q [n_rows, D] int8, scale [n_rows] f32.  One block per row (grid-stride
// over rows); pass 1 reduces max|x| with gp::block_max (exact, so the bits do not depend on
// the launch shape), pass 2 quantizes.  blockDim.x must be a multiple of 32, <= 1024.
template <typename T>
__global__ void quantize_per_token(const T* __restrict__ x, signed char* __restrict__ q,
                                   float* __restrict__ scale, long long n_rows, long long D) {
    using C = typename gp::acc_type<T>::type;
    __shared__ C smem[32];
    for (long long n = blockIdx.x; n < n_rows; n += gridDim.x) {
        const T* xr = x + n * D;
        // amax starts at 0 and fmax ignores NaN: no NaN enters block_max.
        C amax = C(0);
        for (long long d = threadIdx.x; d < D; d += blockDim.x) {
            amax = gpq::vmax(amax, gpq::vabs(gpq::ftz(gp::to_acc<T>(xr[d]))));
        }
        amax = gp::block_max<C>(amax, smem, C(0));
        const float s = gpq::scale_from_amax(amax);
        const C sc = static_cast<C>(s);
        signed char* qr = q + n * D;
        for (long long d = threadIdx.x; d < D; d += blockDim.x) {
            qr[d] = s > 0.0f ? gpq::quantize_one<C>(gpq::ftz(gp::to_acc<T>(xr[d])), sc)
                             : static_cast<signed char>(0);
        }
        if (threadIdx.x == 0) scale[n] = s;
    }
}

// Straight-through backward with a dtype change: dx = dq converted through f32 (FTZ), or
// widened exactly to f64.  A same-dtype backward is a plain device copy, not this kernel.
template <typename Ti, typename To>
__global__ void quantize_per_token_backward_convert(const Ti* __restrict__ dq,
                                                   To* __restrict__ dx, long long total) {
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += stride) {
        const float v = gpq::ftz(gp::to_float<Ti>(dq[i]));
        dx[i] = gp::from_float<To>(v);
    }
}

// y[n, d] = scale[n] * q[n, d], computed in C (f32, or f64 for a double y), then rounded to T.
template <typename T>
__global__ void dequantize_per_token(const signed char* __restrict__ q,
                                     const float* __restrict__ scale, T* __restrict__ y,
                                     long long n_rows, long long D) {
    using C = typename gp::acc_type<T>::type;
    for (long long n = blockIdx.x; n < n_rows; n += gridDim.x) {
        const C s = static_cast<C>(gpq::ftz(scale[n]));
        const signed char* qr = q + n * D;
        T* yr = y + n * D;
        for (long long d = threadIdx.x; d < D; d += blockDim.x) {
            yr[d] = gp::from_acc<T>(gpq::ftz(s * static_cast<C>(qr[d])));
        }
    }
}

// d_input[n, d] = scale[n] * d_output[n, d] in C, rounded to T (straight-through estimator).
template <typename T>
__global__ void dequantize_per_token_backward(const float* __restrict__ scale,
                                              const T* __restrict__ d_output,
                                              T* __restrict__ d_input, long long n_rows,
                                              long long D) {
    using C = typename gp::acc_type<T>::type;
    for (long long n = blockIdx.x; n < n_rows; n += gridDim.x) {
        const C s = static_cast<C>(gpq::ftz(scale[n]));
        const T* gr = d_output + n * D;
        T* dr = d_input + n * D;
        for (long long d = threadIdx.x; d < D; d += blockDim.x) {
            dr[d] = gp::from_acc<T>(gpq::ftz(s * gpq::ftz(gp::to_acc<T>(gr[d]))));
        }
    }
}

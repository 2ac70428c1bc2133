// Shared pieces of the elementwise map kernels (activation, binary, cast): 16-byte packs,
// accumulator loads/stores and the 64-bit grid-stride index.
#pragma once
#include "gpuplan_common.cuh"

namespace gp {

template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };

template <typename T> using Acc = typename acc_type<T>::type;

template <typename T> __device__ __forceinline__ Acc<T> ld(T v) { return to_acc<T>(v); }
template <typename T> __device__ __forceinline__ T st(Acc<T> v) { return from_acc<T>(v); }

__device__ __forceinline__ long long thread_index() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long grid_stride() { return (long long)gridDim.x * blockDim.x; }

__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ double m_rsqrt(double x) { return rsqrt(x); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }

}  // namespace gp

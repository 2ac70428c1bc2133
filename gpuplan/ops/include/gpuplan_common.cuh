// Shared device helpers: accumulator types and conversions for the four float dtypes.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// A kernel's shape or strides over at most 8 collapsed dims, as 8 scalar arguments (launch
// arguments are by value; see gpuplan.ops.broadcast.dims_launch_args) and back as an array.
#define GP_DIMS_PARAMS(p)                                                                  \
    long long p##0, long long p##1, long long p##2, long long p##3, long long p##4,       \
        long long p##5, long long p##6, long long p##7
#define GP_DIMS_ARRAY(p) {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}

namespace gp {

// Offset of the o-th kept element (C order over the first nk dims, sizes shp, element
// strides str): where a reduction over the other dims starts reading.
__device__ __forceinline__ long long kept_offset(long long o, int nk, const long long* shp,
                                                 const long long* str) {
    long long off = 0;
#pragma unroll
    for (int d = 7; d >= 0; --d) {
        if (d < nk) {
            off += (o % shp[d]) * str[d];
            o /= shp[d];
        }
    }
    return off;
}

// Accumulator type: half types accumulate in float, the others in themselves.
template <typename T> struct acc_type { typedef T type; };
template <> struct acc_type<__half> { typedef float type; };
template <> struct acc_type<__nv_bfloat16> { typedef float type; };

template <typename T> __device__ __forceinline__ typename acc_type<T>::type to_acc(T x) { return x; }
template <> __device__ __forceinline__ float to_acc<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_acc<__nv_bfloat16>(__nv_bfloat16 x) {
    return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T from_acc(typename acc_type<T>::type x) { return x; }
template <> __device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Any float dtype to/from float (f64 is narrowed: use only where float math is intended).
template <typename T> __device__ __forceinline__ float to_float(T x) { return static_cast<float>(x); }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
    return __bfloat162float(x);
}
template <typename T> __device__ __forceinline__ T from_float(float x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Warp and block reductions (blockDim.x a multiple of 32, at most 1024).
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A> __device__ __forceinline__ A warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) {
        A w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}
// Sum over the block; every thread gets the result. `smem` holds 32 A's.
template <typename A> __device__ A block_sum(A v, A* smem) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) smem[wid] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    A t = (threadIdx.x < nw) ? smem[threadIdx.x] : A(0);
    if (wid == 0) t = warp_sum(t);
    if (threadIdx.x == 0) smem[0] = t;
    __syncthreads();
    return smem[0];
}
template <typename A> __device__ A block_max(A v, A* smem, A lowest) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) smem[wid] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    A t = (threadIdx.x < nw) ? smem[threadIdx.x] : lowest;
    if (wid == 0) t = warp_max(t);
    if (threadIdx.x == 0) smem[0] = t;
    __syncthreads();
    return smem[0];
}

}  // namespace gp

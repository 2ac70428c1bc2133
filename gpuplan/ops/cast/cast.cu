// Cast kernel: y = D(x) between f32, f64, f16, bf16, int32 and int64. Floats round to
// nearest even, once (int64 -> bf16 through __ll2bfloat16_rn: via double it would round
// twice beyond 2^53); float to int truncates toward zero. With `vec_ok` (both pointers
// aligned to their pack, checked on the host) the loop moves packs of 16 bytes of the wider
// type; the tail and the unaligned case use scalar accesses. Grid-stride, 64-bit.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_map.cuh"

namespace {

using gp::Pack;

// Widen to the type a conversion goes through: float for f32/f16/bf16, else itself.
template <typename S> struct wide { typedef S type; };
template <> struct wide<__half> { typedef float type; };
template <> struct wide<__nv_bfloat16> { typedef float type; };
template <typename S> __device__ __forceinline__ typename wide<S>::type widen(S v) { return v; }
template <> __device__ __forceinline__ float widen<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float widen<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
// Narrow a wide value to D, rounding to nearest even (truncation toward zero for integers).
template <typename D> struct narrow {
    template <typename W> static __device__ __forceinline__ D from(W v) { return static_cast<D>(v); }
};
template <> struct narrow<__half> {
    static __device__ __forceinline__ __half from(float v) { return __float2half_rn(v); }
    static __device__ __forceinline__ __half from(double v) { return __double2half(v); }
    static __device__ __forceinline__ __half from(int v) { return __double2half((double)v); }
    static __device__ __forceinline__ __half from(long long v) { return __double2half((double)v); }
};
template <> struct narrow<__nv_bfloat16> {
    static __device__ __forceinline__ __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
    static __device__ __forceinline__ __nv_bfloat16 from(double v) { return __double2bfloat16(v); }
    static __device__ __forceinline__ __nv_bfloat16 from(int v) { return __double2bfloat16((double)v); }
    // one rounding, also beyond 2^53 where (double)v would round first
    static __device__ __forceinline__ __nv_bfloat16 from(long long v) { return __ll2bfloat16_rn(v); }
};
template <typename D, typename S> __device__ __forceinline__ D convert(S v) {
    return narrow<D>::from(widen<S>(v));
}

}  // namespace

// y = D(x). S, D: the four floats, int, long long. Packs hold 16 bytes of the wider type.
template <typename S, typename D>
__global__ void cast(const S* __restrict__ x, D* __restrict__ y, long long n, int vec_ok) {
    constexpr int N = 16 / (sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
    long long head = 0;
    if (vec_ok) {
        const long long np = n / N;
        const Pack<S, N>* xp = reinterpret_cast<const Pack<S, N>*>(x);
        Pack<D, N>* yp = reinterpret_cast<Pack<D, N>*>(y);
        for (long long p = gp::thread_index(); p < np; p += gp::grid_stride()) {
            const Pack<S, N> in = xp[p];
            Pack<D, N> out;
#pragma unroll
            for (int j = 0; j < N; ++j) out.v[j] = convert<D, S>(in.v[j]);
            yp[p] = out;
        }
        head = np * N;
    }
    for (long long i = head + gp::thread_index(); i < n; i += gp::grid_stride()) {
        y[i] = convert<D, S>(x[i]);
    }
}

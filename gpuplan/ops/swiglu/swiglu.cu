// SwiGLU, the gated MLP activation of Llama: y = silu(gate) * up, silu(g) = g * sigmoid(g),
// and its gradients
//   dgate = dy * up * s * (1 + g (1 - s)),   dup = dy * g * s,   s = sigmoid(g).
// Flat arrays of n elements; T: float, double, __half, __nv_bfloat16, math in gp::Acc<T>
// (float for halves: one rounding, at the store). With `vec_ok` (every pointer 16-byte
// aligned, checked on the host) the loops move 16-byte packs; the tail and the unaligned case
// use scalar accesses. Grid-stride, 64-bit.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_map.cuh"

namespace {

template <typename A> __device__ __forceinline__ A sigmoid(A g) { return A(1) / (A(1) + gp::m_exp(-g)); }

template <typename A> __device__ __forceinline__ A swiglu_value(A g, A u) {
    return g / (A(1) + gp::m_exp(-g)) * u;
}

template <typename A>
__device__ __forceinline__ void swiglu_grads(A g, A u, A dy, A& dg, A& du) {
    const A s = sigmoid(g);
    du = dy * g * s;
    dg = dy * u * s * (A(1) + g * (A(1) - s));
}

}  // namespace

template <typename T>
__global__ void swiglu_forward(const T* __restrict__ gate, const T* __restrict__ up,
                               T* __restrict__ y, long long n, int vec_ok) {
    constexpr int N = 16 / sizeof(T);
    using P = gp::Pack<T, N>;
    long long head = 0;
    if (vec_ok) {
        const long long np = n / N;
        const P* gp_ = reinterpret_cast<const P*>(gate);
        const P* up_ = reinterpret_cast<const P*>(up);
        P* yp = reinterpret_cast<P*>(y);
        for (long long p = gp::thread_index(); p < np; p += gp::grid_stride()) {
            const P g = gp_[p], u = up_[p];
            P out;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                out.v[j] = gp::st<T>(swiglu_value(gp::ld(g.v[j]), gp::ld(u.v[j])));
            }
            yp[p] = out;
        }
        head = np * N;
    }
    for (long long i = head + gp::thread_index(); i < n; i += gp::grid_stride()) {
        y[i] = gp::st<T>(swiglu_value(gp::ld(gate[i]), gp::ld(up[i])));
    }
}

template <typename T>
__global__ void swiglu_backward(const T* __restrict__ gate, const T* __restrict__ up,
                                const T* __restrict__ dy, T* __restrict__ dgate,
                                T* __restrict__ dup, long long n, int vec_ok) {
    using A = gp::Acc<T>;
    constexpr int N = 16 / sizeof(T);
    using P = gp::Pack<T, N>;
    long long head = 0;
    if (vec_ok) {
        const long long np = n / N;
        const P* gp_ = reinterpret_cast<const P*>(gate);
        const P* up_ = reinterpret_cast<const P*>(up);
        const P* dyp = reinterpret_cast<const P*>(dy);
        P* dgp = reinterpret_cast<P*>(dgate);
        P* dup_ = reinterpret_cast<P*>(dup);
        for (long long p = gp::thread_index(); p < np; p += gp::grid_stride()) {
            const P g = gp_[p], u = up_[p], d = dyp[p];
            P og, ou;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                A dg, du;
                swiglu_grads(gp::ld(g.v[j]), gp::ld(u.v[j]), gp::ld(d.v[j]), dg, du);
                og.v[j] = gp::st<T>(dg);
                ou.v[j] = gp::st<T>(du);
            }
            dgp[p] = og;
            dup_[p] = ou;
        }
        head = np * N;
    }
    for (long long i = head + gp::thread_index(); i < n; i += gp::grid_stride()) {
        A dg, du;
        swiglu_grads(gp::ld(gate[i]), gp::ld(up[i]), gp::ld(dy[i]), dg, du);
        dgate[i] = gp::st<T>(dg);
        dup[i] = gp::st<T>(du);
    }
}

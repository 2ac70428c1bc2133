// Activation kernels: y = f(x) and dx = dy * f'(x) over flat arrays. T: float, double,
// __half, __nv_bfloat16; math runs in gp::Acc<T> (f32 for halves). With `vec_ok` (every
// pointer 16-byte aligned, checked on the host) the loops move 16-byte packs; the tail and
// the unaligned case use scalar accesses. All loops are grid-stride, 64-bit.
//
// The enumerators of `Activation` come from the Python table (gpuplan/ops/activation.py,
// ACTIVATIONS) through -DGPUPLAN_ENUM_Activation: a table row without a branch below fails
// to compile (the static_assert), a branch whose row is gone names an undeclared value.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_map.cuh"

namespace {

using gp::Acc;
using gp::ld;
using gp::Pack;
using gp::st;

enum Activation { GPUPLAN_ENUM_Activation };

template <int OP> constexpr bool unknown_op = OP < 0;

template <int OP, typename A> __device__ __forceinline__ A act_forward(A x, A alpha) {
    using gp::m_erf;
    using gp::m_exp;
    using gp::m_tanh;
    if constexpr (OP == RELU) {
        return x > A(0) ? x : A(0);
    } else if constexpr (OP == GELU) {
        return A(0.5) * x * (A(1) + m_erf(x * A(0.70710678118654752440)));
    } else if constexpr (OP == GELU_TANH) {
        const A u = A(0.79788456080286535588) * (x + A(0.044715) * x * x * x);
        return A(0.5) * x * (A(1) + m_tanh(u));
    } else if constexpr (OP == SILU) {
        return x / (A(1) + m_exp(-x));
    } else if constexpr (OP == TANH) {
        return m_tanh(x);
    } else if constexpr (OP == EXP) {
        return m_exp(x);
    } else if constexpr (OP == NEG) {
        return -x;
    } else if constexpr (OP == SCALE) {
        return alpha * x;
    } else {
        static_assert(unknown_op<OP>, "activation without CUDA forward math");
        return x;
    }
}

// dx = dy * f'(x), x being the forward input.
template <int OP, typename A> __device__ __forceinline__ A act_backward(A x, A dy, A alpha) {
    using gp::m_erf;
    using gp::m_exp;
    using gp::m_tanh;
    if constexpr (OP == RELU) {
        return x > A(0) ? dy : A(0);
    } else if constexpr (OP == GELU) {
        const A cdf = A(0.5) * (A(1) + m_erf(x * A(0.70710678118654752440)));
        const A pdf = A(0.39894228040143267794) * m_exp(A(-0.5) * x * x);
        return dy * (cdf + x * pdf);
    } else if constexpr (OP == GELU_TANH) {
        const A k = A(0.79788456080286535588), c = A(0.044715);
        const A t = m_tanh(k * (x + c * x * x * x));
        const A dt = k * (A(1) + A(3) * c * x * x);
        return dy * (A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * dt);
    } else if constexpr (OP == SILU) {
        const A s = A(1) / (A(1) + m_exp(-x));
        return dy * s * (A(1) + x * (A(1) - s));
    } else if constexpr (OP == TANH) {
        const A t = m_tanh(x);
        return dy * (A(1) - t * t);
    } else if constexpr (OP == EXP) {
        return dy * m_exp(x);
    } else if constexpr (OP == NEG) {
        return -dy;
    } else if constexpr (OP == SCALE) {
        return alpha * dy;
    } else {
        static_assert(unknown_op<OP>, "activation without CUDA backward math");
        return dy;
    }
}

}  // namespace

template <typename T, int OP>
__global__ void unary_forward(const T* __restrict__ x, T* __restrict__ y, long long n,
                              Acc<T> alpha, int vec_ok) {
    constexpr int N = 16 / sizeof(T);
    long long head = 0;
    if (vec_ok) {
        const long long np = n / N;
        const Pack<T, N>* xp = reinterpret_cast<const Pack<T, N>*>(x);
        Pack<T, N>* yp = reinterpret_cast<Pack<T, N>*>(y);
        for (long long p = gp::thread_index(); p < np; p += gp::grid_stride()) {
            const Pack<T, N> in = xp[p];
            Pack<T, N> out;
#pragma unroll
            for (int j = 0; j < N; ++j) out.v[j] = st<T>(act_forward<OP>(ld(in.v[j]), alpha));
            yp[p] = out;
        }
        head = np * N;
    }
    for (long long i = head + gp::thread_index(); i < n; i += gp::grid_stride()) {
        y[i] = st<T>(act_forward<OP>(ld(x[i]), alpha));
    }
}

template <typename T, int OP>
__global__ void unary_backward(const T* __restrict__ x, const T* __restrict__ dy,
                               T* __restrict__ dx, long long n, Acc<T> alpha, int vec_ok) {
    constexpr int N = 16 / sizeof(T);
    long long head = 0;
    if (vec_ok) {
        const long long np = n / N;
        const Pack<T, N>* xp = reinterpret_cast<const Pack<T, N>*>(x);
        const Pack<T, N>* gp_ = reinterpret_cast<const Pack<T, N>*>(dy);
        Pack<T, N>* op = reinterpret_cast<Pack<T, N>*>(dx);
        for (long long p = gp::thread_index(); p < np; p += gp::grid_stride()) {
            const Pack<T, N> xv = xp[p], gv = gp_[p];
            Pack<T, N> out;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                out.v[j] = st<T>(act_backward<OP>(ld(xv.v[j]), ld(gv.v[j]), alpha));
            }
            op[p] = out;
        }
        head = np * N;
    }
    for (long long i = head + gp::thread_index(); i < n; i += gp::grid_stride()) {
        dx[i] = st<T>(act_backward<OP>(ld(x[i]), ld(dy[i]), alpha));
    }
}

// Activation math shared by the activation kernels (activation.cu) and the GEMM epilogue
// (gemm.cu): act_forward<OP>(x) = f(x) and act_backward<OP>(x, dy) = dy * f'(x) in the
// accumulator type A (float or double). alpha and beta are the row's run-time scalars: the
// factor of SCALE, the bounds of CLAMP (-inf / +inf when absent); the GEMM passes none.
//
// The enumerators of `Activation` come from the Python table (gpuplan/ops/activation/plans.py,
// ACTIVATIONS) through -DGPUPLAN_ENUM_Activation, which every module including this header
// passes: a table row without a branch below fails to compile (the static_assert), a branch
// whose row is gone names an undeclared value.
#pragma once
#include "gpuplan_map.cuh"

enum Activation { GPUPLAN_ENUM_Activation };

namespace gp {

template <int OP> constexpr bool unknown_activation = OP < 0;

template <int OP, typename A>
__device__ __forceinline__ A act_forward(A x, A alpha, A beta = A(0)) {
    if constexpr (OP == RELU) {
        return x > A(0) || x != x ? x : A(0);  // NaN propagates, as in PyTorch
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
    } else if constexpr (OP == LOG) {
        return m_log(x);
    } else if constexpr (OP == SQRT) {
        return m_sqrt(x);
    } else if constexpr (OP == RSQRT) {
        return m_rsqrt(x);
    } else if constexpr (OP == SIGMOID) {
        return A(1) / (A(1) + m_exp(-x));
    } else if constexpr (OP == ABS) {
        return m_abs(x);
    } else if constexpr (OP == CLAMP) {
        // min(max(x, lo), hi) as PyTorch: NaN fails both tests and stays, lo > hi gives hi
        const A t = x < alpha ? alpha : x;
        return t > beta ? beta : t;
    } else {
        static_assert(unknown_activation<OP>, "activation without CUDA forward math");
        return x;
    }
}

// dx = dy * f'(x), x being the forward input.
template <int OP, typename A>
__device__ __forceinline__ A act_backward(A x, A dy, A alpha, A beta = A(0)) {
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
    } else if constexpr (OP == LOG) {
        return dy / x;
    } else if constexpr (OP == SQRT) {
        return dy / (A(2) * m_sqrt(x));
    } else if constexpr (OP == RSQRT) {
        const A r = m_rsqrt(x);
        return A(-0.5) * dy * r * r * r;
    } else if constexpr (OP == SIGMOID) {
        const A s = A(1) / (A(1) + m_exp(-x));
        return dy * s * (A(1) - s);
    } else if constexpr (OP == ABS) {
        return x > A(0) ? dy : (x < A(0) ? -dy : A(0));
    } else if constexpr (OP == CLAMP) {
        return x >= alpha && x <= beta ? dy : A(0);
    } else {
        static_assert(unknown_activation<OP>, "activation without CUDA backward math");
        return dy;
    }
}

}  // namespace gp

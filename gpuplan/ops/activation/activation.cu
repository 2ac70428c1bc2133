// Activation kernels: y = f(x) and dx = dy * f'(x) over flat arrays. T: float, double,
// __half, __nv_bfloat16; math runs in gp::Acc<T> (f32 for halves). With `vec_ok` (every
// pointer 16-byte aligned, checked on the host) the loops move 16-byte packs; the tail and
// the unaligned case use scalar accesses. All loops are grid-stride, 64-bit.
//
// The math of every activation (act_forward, act_backward) lives in gpuplan_activation.cuh,
// shared with the GEMM epilogue (gemm.cu); its enum `Activation` comes from the Python table
// (gpuplan/ops/activation/plans.py, ACTIVATIONS) through -DGPUPLAN_ENUM_Activation.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_activation.cuh"

namespace {

using gp::Acc;
using gp::act_backward;
using gp::act_forward;
using gp::ld;
using gp::Pack;
using gp::st;

}  // namespace

template <typename T, int OP>
__global__ void unary_forward(const T* __restrict__ x, T* __restrict__ y, long long n,
                              Acc<T> alpha, Acc<T> beta, int vec_ok) {
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
            for (int j = 0; j < N; ++j) {
                out.v[j] = st<T>(act_forward<OP>(ld(in.v[j]), alpha, beta));
            }
            yp[p] = out;
        }
        head = np * N;
    }
    for (long long i = head + gp::thread_index(); i < n; i += gp::grid_stride()) {
        y[i] = st<T>(act_forward<OP>(ld(x[i]), alpha, beta));
    }
}

template <typename T, int OP>
__global__ void unary_backward(const T* __restrict__ x, const T* __restrict__ dy,
                               T* __restrict__ dx, long long n, Acc<T> alpha, Acc<T> beta,
                               int vec_ok) {
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
                out.v[j] = st<T>(act_backward<OP>(ld(xv.v[j]), ld(gv.v[j]), alpha, beta));
            }
            op[p] = out;
        }
        head = np * N;
    }
    for (long long i = head + gp::thread_index(); i < n; i += gp::grid_stride()) {
        dx[i] = st<T>(act_backward<OP>(ld(x[i]), ld(dy[i]), alpha, beta));
    }
}

// Fused optimizer steps (PyTorch AdamW and SGD semantics), elementwise and in place.
// P: float or double (master weights and moments, also the math type).
// G: gradient type (float, __half, __nv_bfloat16 for P = float; double for P = double).
// L: low-precision copy of the weights (__half or __nv_bfloat16), written when write_lowp.
// The step's scalars (bias corrections, decay factor) are computed once on the host in
// double and passed rounded to P, so every element uses exactly the same constants. When
// `hyper` is not null the AdamW kernels read them from there instead (device memory a
// captured CUDA graph reads at every replay, refreshed before each: the by-value arguments
// would be frozen at capture).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_common.cuh"

namespace {

template <typename P, typename G> __device__ __forceinline__ P load_grad(const G* g, long long i) {
    return static_cast<P>(gp::to_acc<G>(g[i]));
}

template <typename L, typename P> __device__ __forceinline__ L round_lowp(P x);
template <> __device__ __forceinline__ __half round_lowp<__half, float>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 round_lowp<__nv_bfloat16, float>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half round_lowp<__half, double>(double x) {
    return __double2half(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 round_lowp<__nv_bfloat16, double>(double x) {
    return __double2bfloat16(x);
}

// One AdamW element:
//   p = p * decay                              decay = 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   p = p - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
// with step_size = lr / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t).
template <typename P, typename G, typename L>
__device__ __forceinline__ void adamw_element(P* p, const G* g, P* m, P* v, L* lowp, long long i,
                                              P decay, P beta1, P one_minus_beta1, P beta2,
                                              P one_minus_beta2, P step_size, P inv_sqrt_bc2,
                                              P eps, int write_lowp) {
    const P gi = load_grad<P, G>(g, i);
    P pi = p[i] * decay;
    const P mi = beta1 * m[i] + one_minus_beta1 * gi;
    const P vi = beta2 * v[i] + one_minus_beta2 * (gi * gi);
    const P denom = sqrt(vi) * inv_sqrt_bc2 + eps;
    pi = pi - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (write_lowp) lowp[i] = round_lowp<L, P>(pi);
}

// AdamW's scalars from device memory (hyper[0..7], the order of the by-value parameters).
template <typename P>
__device__ __forceinline__ void load_adamw_hyper(const P* hyper, P& decay, P& beta1,
                                                 P& one_minus_beta1, P& beta2,
                                                 P& one_minus_beta2, P& step_size,
                                                 P& inv_sqrt_bc2, P& eps) {
    decay = hyper[0];
    beta1 = hyper[1];
    one_minus_beta1 = hyper[2];
    beta2 = hyper[3];
    one_minus_beta2 = hyper[4];
    step_size = hyper[5];
    inv_sqrt_bc2 = hyper[6];
    eps = hyper[7];
}

}  // namespace

// Single tensor, grid-stride over n elements.
template <typename P, typename G, typename L>
__global__ void adamw_step_kernel(P* __restrict__ p, const G* __restrict__ g, P* __restrict__ m,
                                  P* __restrict__ v, L* __restrict__ lowp, long long n, P decay,
                                  P beta1, P one_minus_beta1, P beta2, P one_minus_beta2,
                                  P step_size, P inv_sqrt_bc2, P eps, int write_lowp,
                                  const P* __restrict__ hyper) {
    if (hyper != nullptr) {
        load_adamw_hyper<P>(hyper, decay, beta1, one_minus_beta1, beta2, one_minus_beta2,
                            step_size, inv_sqrt_bc2, eps);
    }
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        adamw_element<P, G, L>(p, g, m, v, lowp, i, decay, beta1, one_minus_beta1, beta2,
                               one_minus_beta2, step_size, inv_sqrt_bc2, eps, write_lowp);
    }
}

// Many tensors in one launch. tensors[t] = {n, p, g, m, v, lowp} (6 long longs: the element
// count then device addresses); chunks[b] = {t, start}: block b updates elements
// [start, min(start + chunk, n_t)) of tensor t. gridDim.x == number of chunks.
template <typename P, typename G, typename L>
__global__ void adamw_multi_tensor_kernel(const long long* __restrict__ tensors,
                                          const long long* __restrict__ chunks, long long chunk,
                                          P decay, P beta1, P one_minus_beta1, P beta2,
                                          P one_minus_beta2, P step_size, P inv_sqrt_bc2, P eps,
                                          int write_lowp, const P* __restrict__ hyper) {
    if (hyper != nullptr) {
        load_adamw_hyper<P>(hyper, decay, beta1, one_minus_beta1, beta2, one_minus_beta2,
                            step_size, inv_sqrt_bc2, eps);
    }
    const long long t = chunks[2 * static_cast<long long>(blockIdx.x)];
    const long long start = chunks[2 * static_cast<long long>(blockIdx.x) + 1];
    const long long* row = tensors + 6 * t;
    const long long n = row[0];
    P* p = reinterpret_cast<P*>(row[1]);
    const G* g = reinterpret_cast<const G*>(row[2]);
    P* m = reinterpret_cast<P*>(row[3]);
    P* v = reinterpret_cast<P*>(row[4]);
    L* lowp = reinterpret_cast<L*>(row[5]);
    const long long end = start + chunk < n ? start + chunk : n;
    for (long long i = start + threadIdx.x; i < end; i += blockDim.x) {
        adamw_element<P, G, L>(p, g, m, v, lowp, i, decay, beta1, one_minus_beta1, beta2,
                               one_minus_beta2, step_size, inv_sqrt_bc2, eps, write_lowp);
    }
}

// SGD (PyTorch): g = grad + weight_decay * p;
//   with momentum: buf = first_step ? g : momentum * buf + (1 - dampening) * g,
//                  g = nesterov ? g + momentum * buf : buf;
//   p = p - lr * g.
template <typename P, typename G, typename L>
__global__ void sgd_step_kernel(P* __restrict__ p, const G* __restrict__ g, P* __restrict__ buf,
                                L* __restrict__ lowp, long long n, P lr, P weight_decay,
                                P momentum, P one_minus_dampening, int use_momentum,
                                int first_step, int nesterov, int write_lowp) {
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        P pi = p[i];
        P d = load_grad<P, G>(g, i);
        if (weight_decay != P(0)) d = d + weight_decay * pi;
        if (use_momentum) {
            const P b = first_step ? d : momentum * buf[i] + one_minus_dampening * d;
            buf[i] = b;
            d = nesterov ? d + momentum * b : b;
        }
        pi = pi - lr * d;
        p[i] = pi;
        if (write_lowp) lowp[i] = round_lowp<L, P>(pi);
    }
}

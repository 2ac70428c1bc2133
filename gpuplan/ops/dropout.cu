// Dropout kernels driven by the counter-based Philox4x32-10 generator (Salmon et al., SC'11,
// as in Random123 and cuRAND). T: float, double, __half, __nv_bfloat16.
//
// Mapping (identical to gpuplan/ops/dropout.py, which reproduces these bits on the host):
//   key     = (lo32(seed), hi32(seed))
//   counter = (lo32(j), hi32(j), 0, 0) with j = offset + i / 4 (mod 2^64)
//   word    = philox4x32_10(counter, key)[i % 4]
//   u       = float(word >> 8) * 2^-24          (exact: a 24-bit integer times a power of 2)
//   keep    = u >= float32(p)
// One thread draws one counter and handles its four elements, so the generator runs once per
// four elements and the mask never depends on the launch shape.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_common.cuh"

namespace {

struct Philox4 {
    unsigned int v[4];
};

__device__ __forceinline__ Philox4 philox4x32_10(unsigned long long j, unsigned long long seed) {
    const unsigned int M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    const unsigned int W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    unsigned int c0 = static_cast<unsigned int>(j), c1 = static_cast<unsigned int>(j >> 32);
    unsigned int c2 = 0u, c3 = 0u;
    unsigned int k0 = static_cast<unsigned int>(seed), k1 = static_cast<unsigned int>(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += W0;
            k1 += W1;
        }
        const unsigned int hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
        const unsigned int hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
        const unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    Philox4 out;
    out.v[0] = c0;
    out.v[1] = c1;
    out.v[2] = c2;
    out.v[3] = c3;
    return out;
}

__device__ __forceinline__ bool keep_element(unsigned int word, float p) {
    return static_cast<float>(word >> 8) * 0x1p-24f >= p;
}

// Four consecutive elements moved with one (or, for double, two) vector memory operations.
template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
    T v[4];
};

}  // namespace

// y[i] = keep(i) ? x[i] * scale : 0 for i < n. Forward (x, y) and backward (dy, dx) alike.
// scale is float for f32/f16/bf16 (the product is taken in float, then rounded to nearest
// even) and double for f64. `aligned` != 0 promises x and y are aligned to 4 * sizeof(T).
template <typename T>
__global__ void dropout_apply(const T* __restrict__ x, T* __restrict__ y, long long n,
                              unsigned long long seed, unsigned long long offset, float p,
                              typename gp::acc_type<T>::type scale, int aligned) {
    using Acc = typename gp::acc_type<T>::type;
    const long long n_groups = (n + 3) / 4;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long g = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
         g < n_groups; g += stride) {
        const Philox4 r = philox4x32_10(offset + static_cast<unsigned long long>(g), seed);
        const long long base = 4 * g;
        if (aligned && base + 4 <= n) {
            const Vec4<T> in = reinterpret_cast<const Vec4<T>*>(x)[g];
            Vec4<T> out;
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                out.v[l] = keep_element(r.v[l], p) ? gp::from_acc<T>(gp::to_acc<T>(in.v[l]) * scale)
                                                   : gp::from_acc<T>(Acc(0));
            }
            reinterpret_cast<Vec4<T>*>(y)[g] = out;
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const long long i = base + l;
                if (i < n) {
                    y[i] = keep_element(r.v[l], p) ? gp::from_acc<T>(gp::to_acc<T>(x[i]) * scale)
                                                   : gp::from_acc<T>(Acc(0));
                }
            }
        }
    }
}

// mask[i] = keep(i) for i < n. `aligned` != 0 promises mask is aligned to 4 bytes.
__global__ void dropout_keep_mask(bool* __restrict__ mask, long long n, unsigned long long seed,
                                  unsigned long long offset, float p, int aligned) {
    const long long n_groups = (n + 3) / 4;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long g = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
         g < n_groups; g += stride) {
        const Philox4 r = philox4x32_10(offset + static_cast<unsigned long long>(g), seed);
        const long long base = 4 * g;
        if (aligned && base + 4 <= n) {
            Vec4<bool> out;
#pragma unroll
            for (int l = 0; l < 4; ++l) out.v[l] = keep_element(r.v[l], p);
            reinterpret_cast<Vec4<bool>*>(mask)[g] = out;
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                if (base + l < n) mask[base + l] = keep_element(r.v[l], p);
            }
        }
    }
}

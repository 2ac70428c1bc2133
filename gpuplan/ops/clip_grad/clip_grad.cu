// Gradient clipping, the scaling half (the norm is reduction.cu's global_l2_norm, launched
// just before on the same table). `table` (int64), as global_l2_norm reads it: ptr[n],
// size[n], code[n] (a NormType), chunk_prefix[n + 1], counter.
//   total = use_given ? given : norm[0]   (where global_l2_norm left it: no host round trip)
//   coef  = max_norm / (total + eps)      (in double, as the host computes it)
//   g    *= coef for every element of every tensor, unless coef >= 1 (then nothing is
//           written; a NaN coef scales, so a NaN norm propagates as PyTorch's clamp does)
// Each element becomes from_acc(Acc(coef) * to_acc(g)): the activation family's 'scale' bit
// for bit. `NormType` comes from gpuplan/ops/reduction/launch.py (NORM_DTYPES).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_common.cuh"

enum NormType { GPUPLAN_ENUM_NormType, NORM_TYPE_COUNT };
static_assert(NORM_TYPE_COUNT == 4, "a NormType row without a branch in clip_grad_scale");

namespace {

constexpr long long kChunk = GPUPLAN_NORM_CHUNK;

template <typename T>
__device__ __forceinline__ void scale_range(long long ptr, long long start, long long end,
                                            double coef) {
    using Acc = typename gp::acc_type<T>::type;
    T* g = reinterpret_cast<T*>(ptr);
    const Acc c = static_cast<Acc>(coef);
    for (long long i = start + threadIdx.x; i < end; i += blockDim.x) {
        g[i] = gp::from_acc<T>(c * gp::to_acc<T>(g[i]));
    }
}

}  // namespace

// grid: any (chunks are walked grid-stride), block: 256. A: the norm's type (float, double).
template <typename A>
__global__ void __launch_bounds__(256) clip_grad_scale(const long long* __restrict__ table, int n,
                                                       const A* __restrict__ norm,
                                                       double max_norm, double eps,
                                                       double given, int use_given) {
    const double total = use_given ? given : static_cast<double>(norm[0]);
    const double coef = max_norm / (total + eps);
    if (coef >= 1.0) return;
    const long long* ptrs = table;
    const long long* sizes = table + n;
    const long long* codes = table + 2 * n;
    const long long* prefix = table + 3 * n;
    const long long n_chunks = prefix[n];
    for (long long g = blockIdx.x; g < n_chunks; g += gridDim.x) {
        int lo = 0, hi = n - 1;  // tensor holding chunk g: last i with prefix[i] <= g
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (prefix[mid] <= g) lo = mid; else hi = mid - 1;
        }
        const long long start = (g - prefix[lo]) * kChunk;
        const long long end = start + kChunk < sizes[lo] ? start + kChunk : sizes[lo];
        const long long code = codes[lo];
        if (code == F32) scale_range<float>(ptrs[lo], start, end, coef);
        else if (code == F64) scale_range<double>(ptrs[lo], start, end, coef);
        else if (code == F16) scale_range<__half>(ptrs[lo], start, end, coef);
        else scale_range<__nv_bfloat16>(ptrs[lo], start, end, coef);  // BF16
    }
}

// Reductions along one dim that keep positions: max/min with indices, top-k.
// T: float, double, __half, __nv_bfloat16 (compared and accumulated in gp::acc_type<T>).
// x is viewed as [outer, R, inner]: the reduced dim has length R and element stride inner.
// Order of values (SEL_MAX): NaN first (the first NaN wins, like torch), then larger values,
// equal values by ascending index; SEL_MIN: NaN first, then smaller values, then index.
// The selection is a total order, so results never depend on the launch shape.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_common.cuh"

enum Select { GPUPLAN_ENUM_Select };

namespace {

template <int SEL> constexpr bool unknown_select = SEL < 0;

// True when (v, i) comes before (bv, bi) in SEL's order; bi < 0 means "nothing yet".
template <int SEL, typename A>
__device__ __forceinline__ bool comes_first(A v, long long i, A bv, long long bi) {
    if (bi < 0) return i >= 0;
    if (i < 0) return false;
    const bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && (!bn || i < bi);
    if (v == bv) return i < bi;
    if constexpr (SEL == SEL_MAX) {
        return v > bv;
    } else if constexpr (SEL == SEL_MIN) {
        return v < bv;
    } else {
        static_assert(unknown_select<SEL>, "a Select row without a comparison");
        return false;
    }
}

// Warp-wide: every lane ends with the first pair of the warp's pairs in SEL's order.
template <int SEL, typename A> __device__ __forceinline__ void warp_select(A& v, long long& i) {
    for (int o = 16; o > 0; o >>= 1) {
        const A ov = __shfl_xor_sync(0xffffffffu, v, o);
        const long long oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (comes_first<SEL, A>(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

}  // namespace

// values[o, k] / indices[o, k] = the first element of x[o, :, k] in SEL's order.
// TPR == 1: a thread per output walks r = 0..R-1 (any inner); TPR == 32 (inner == 1): a
// warp per output, lanes take r = lane, lane + 32, ... Launch with blockDim.x == 256.
template <typename T, int SEL, int TPR>
__global__ void __launch_bounds__(256) arg_select(const T* __restrict__ x, T* __restrict__ values,
                                                  long long* __restrict__ indices, long long outer,
                                                  long long R, long long inner) {
    using A = typename gp::acc_type<T>::type;
    const long long n_out = outer * inner;
    const long long per_block = 256 / TPR;
    const int lane = threadIdx.x % TPR;
    // Every lane of a warp runs the same iterations (TPR == 32 shuffles inside).
    for (long long base = (long long)blockIdx.x * per_block; base < n_out;
         base += (long long)gridDim.x * per_block) {
        const long long t = base + threadIdx.x / TPR;
        A bv = A(0);
        long long bi = -1;
        if (t < n_out) {
            const T* src = x + (t / inner) * R * inner + t % inner;
            for (long long r = lane; r < R; r += TPR) {
                const A v = gp::to_acc<T>(src[r * inner]);
                if (comes_first<SEL, A>(v, r, bv, bi)) {
                    bv = v;
                    bi = r;
                }
            }
        }
        if constexpr (TPR == 32) warp_select<SEL, A>(bv, bi);
        if (lane == 0 && t < n_out) {
            values[t] = gp::from_acc<T>(bv);
            indices[t] = bi;
        }
    }
}

// Top k of x[o, :, i] in SEL's order, written to values/indices [outer, k, inner] in that
// order. One block (256 threads) per (o, i): step s selects the first element that comes
// after step s-1's choice (k passes over the row: O(k * R) work per row, meant for modest k).
template <typename T, int SEL>
__global__ void __launch_bounds__(256) topk_select(const T* __restrict__ x, T* __restrict__ values,
                                                   long long* __restrict__ indices, long long outer,
                                                   long long R, long long inner, long long k) {
    using A = typename gp::acc_type<T>::type;
    __shared__ A sv[8];
    __shared__ long long si[8];
    const long long n_rows = outer * inner;
    for (long long row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const long long o = row / inner, c = row % inner;
        const T* src = x + o * R * inner + c;
        A pv = A(0);
        long long pi = -1;  // the previous choice (none before step 0)
        for (long long s = 0; s < k; ++s) {
            A bv = A(0);
            long long bi = -1;
            for (long long r = threadIdx.x; r < R; r += 256) {
                const A v = gp::to_acc<T>(src[r * inner]);
                if ((pi < 0 || comes_first<SEL, A>(pv, pi, v, r)) &&
                    comes_first<SEL, A>(v, r, bv, bi)) {
                    bv = v;
                    bi = r;
                }
            }
            warp_select<SEL, A>(bv, bi);
            __syncthreads();  // sv/si are reused across steps
            if ((threadIdx.x & 31) == 0) {
                sv[threadIdx.x >> 5] = bv;
                si[threadIdx.x >> 5] = bi;
            }
            __syncthreads();
            bv = sv[0];
            bi = si[0];
#pragma unroll
            for (int w = 1; w < 8; ++w) {
                if (comes_first<SEL, A>(sv[w], si[w], bv, bi)) {
                    bv = sv[w];
                    bi = si[w];
                }
            }
            if (threadIdx.x == 0) {
                values[(o * k + s) * inner + c] = gp::from_acc<T>(bv);
                indices[(o * k + s) * inner + c] = bi;
            }
            pv = bv;
            pi = bi;
        }
    }
}

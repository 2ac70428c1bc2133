// Indexing along one dim: gather (and index_select) and the deterministic scatter-add (and
// index_add) that is its gradient.
// T: float, double, __half, __nv_bfloat16.  I: int or long long (the index dtype).
// x / out are viewed as [outer, L, inner], index and src as [outer, n, inner]; SHARED: one
// index vector [n] for every (o, i) (index_select / index_add).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_common.cuh"

// out[o, j, i] = x[o, index[o, j, i], i] (SHARED: index[j]); an index outside [0, L) gives 0
// (never read: the functional API rejects such indices before launching).
template <typename T, typename I, int SHARED>
__global__ void __launch_bounds__(256) gather_dim(const T* __restrict__ x, const I* __restrict__ index,
                                                  T* __restrict__ out, long long outer, long long L,
                                                  long long inner, long long n) {
    const long long total = outer * n * inner;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const long long i = t % inner;
        const long long j = (t / inner) % n;
        const long long o = t / (inner * n);
        const long long r = static_cast<long long>(index[SHARED ? j : t]);
        out[t] = (r >= 0 && r < L) ? x[(o * L + r) * inner + i] : gp::from_float<T>(0.0f);
    }
}

// out[o, r, i] += sum of src[o, j, i] over the j with index == r, in ascending j, summed in
// the accumulator type and added once (out is untouched where no index points). `keys` are
// the column's entries sorted by (index, j), packed as index * n + j with index clamped to
// [-1, L] (out-of-range entries never match a row); SHARED: one sorted column [n], else
// [outer, n, inner] sorted along n. A thread per out element finds its run of keys by binary
// search: no atomics, the same bits on every run and device.
template <typename T>
__global__ void __launch_bounds__(256) scatter_add_sorted(T* __restrict__ out, const T* __restrict__ src,
                                                          const long long* __restrict__ keys,
                                                          long long outer, long long L,
                                                          long long inner, long long n, int shared) {
    using A = typename gp::acc_type<T>::type;
    const long long total = outer * L * inner;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const long long i = t % inner;
        const long long r = (t / inner) % L;
        const long long o = t / (inner * L);
        const long long base = shared ? 0 : o * n * inner + i;
        const long long stride = shared ? 1 : inner;
        // First position whose key >= r * n (keys of row r are r * n + j, 0 <= j < n).
        long long lo = 0, hi = n;
        const long long first = r * n;
        while (lo < hi) {
            const long long mid = (lo + hi) >> 1;
            if (keys[base + mid * stride] < first) lo = mid + 1; else hi = mid;
        }
        A acc = A(0);
        bool any = false;
        for (long long p = lo; p < n; ++p) {
            const long long key = keys[base + p * stride];
            if (key >= first + n) break;
            const long long j = key - first;
            acc += gp::to_acc<T>(src[(o * n + j) * inner + i]);
            any = true;
        }
        if (any) out[t] = gp::from_acc<T>(gp::to_acc<T>(out[t]) + acc);
    }
}

// Embedding forward (gather) and backward (scatter-add) kernels.
// T: float, double, __half, __nv_bfloat16.  I: int or long long (index dtype).
// Entry n looks up row idx[n] - offset (offset: the descriptor's index_offset, the first
// index of this table's block in the caller's index space).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_common.cuh"

// The row of index v, or -1 when v - offset is outside [0, V). Exact for every int64 v and
// offset: v >= offset makes the unsigned difference the true one (no signed overflow).
__device__ __forceinline__ long long embedding_row(long long v, long long offset, long long V) {
    const unsigned long long r =
        static_cast<unsigned long long>(v) - static_cast<unsigned long long>(offset);
    return (v >= offset && r < static_cast<unsigned long long>(V)) ? static_cast<long long>(r)
                                                                     : -1;
}

// out[n, :] = weight[idx[n] - offset, :], or zeros when that row is outside [0, V).
// grid.x walks rows (grid-stride), threads walk the embedding dimension.
template <typename T, typename I>
__global__ void embedding_forward(const T* __restrict__ weight, const I* __restrict__ idx,
                                  T* __restrict__ out, long long n_rows, long long V, long long D,
                                  long long offset) {
    for (long long n = blockIdx.x; n < n_rows; n += gridDim.x) {
        const long long v = embedding_row(static_cast<long long>(idx[n]), offset, V);
        const bool valid = v >= 0;
        T* dst = out + n * D;
        const T* src = weight + (valid ? v : 0) * D;
        for (long long d = threadIdx.x; d < D; d += blockDim.x) {
            dst[d] = valid ? src[d] : gp::from_float<T>(0.0f);
        }
    }
}

// dweight[idx[n] - offset, :] += dout[n, :] with atomics: fast, order of additions
// unspecified. padding_row: the row of padding_idx, or -1 (none in this table).
template <typename T, typename I>
__global__ void embedding_backward_atomic(const T* __restrict__ dout, const I* __restrict__ idx,
                                          T* __restrict__ dweight, long long n_rows, long long V,
                                          long long D, long long padding_row, long long offset) {
    for (long long n = blockIdx.x; n < n_rows; n += gridDim.x) {
        const long long v = embedding_row(static_cast<long long>(idx[n]), offset, V);
        if (v < 0 || v == padding_row) continue;
        for (long long d = threadIdx.x; d < D; d += blockDim.x) {
            atomicAdd(dweight + v * D + d, dout[n * D + d]);
        }
    }
}

// Deterministic segment reduction over rows sorted stably by index.
// order[s] is the s-th row in (index, row) order; sorted_idx[s] = idx[order[s]].
// The block of a segment's first position sums the segment in ascending row order in the
// accumulator type, then adds the sum to dweight once: the bits do not depend on launch shape.
// The shift is one-to-one on valid rows, so segments of equal index are segments of equal row.
template <typename T, typename I>
__global__ void embedding_backward_segment(const T* __restrict__ dout,
                                           const long long* __restrict__ order,
                                           const I* __restrict__ sorted_idx,
                                           T* __restrict__ dweight, long long n_rows, long long V,
                                           long long D, long long padding_row, long long offset) {
    using Acc = typename gp::acc_type<T>::type;
    for (long long s = blockIdx.x; s < n_rows; s += gridDim.x) {
        const long long raw = static_cast<long long>(sorted_idx[s]);
        const long long v = embedding_row(raw, offset, V);
        if (v < 0 || v == padding_row) continue;
        if (s > 0 && static_cast<long long>(sorted_idx[s - 1]) == raw) continue;
        long long e = s + 1;
        while (e < n_rows && static_cast<long long>(sorted_idx[e]) == raw) ++e;
        for (long long d = threadIdx.x; d < D; d += blockDim.x) {
            Acc acc = Acc(0);
            for (long long t = s; t < e; ++t) {
                acc += gp::to_acc<T>(dout[order[t] * D + d]);
            }
            T* w = dweight + v * D + d;
            *w = gp::from_acc<T>(gp::to_acc<T>(*w) + acc);
        }
    }
}

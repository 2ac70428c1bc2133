// Selection kernels: out = cond ? a : b with NumPy broadcasting, and the triangles (tril,
// triu) of a batch of matrices. T: float, double, __half, __nv_bfloat16, int, long long,
// bool; values are copied, never converted (NaN keeps its bits). All loops are grid-stride,
// 64-bit.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_map.cuh"

namespace {

// Offsets into cond, a and b of the output element i (C order over the collapsed shape
// `shp`, element strides, 0 on broadcast dims).
__device__ __forceinline__ void where_offsets(long long i, int ndim, const long long* shp,
                                              const long long* sc, const long long* sa,
                                              const long long* sb, long long& oc,
                                              long long& oa, long long& ob) {
    oc = 0;
    oa = 0;
    ob = 0;
#pragma unroll
    for (int d = 7; d >= 0; --d) {
        if (d < ndim) {
            const long long q = i / shp[d];
            const long long r = i - q * shp[d];
            oc += r * sc[d];
            oa += r * sa[d];
            ob += r * sb[d];
            i = q;
        }
    }
}

}  // namespace

// out[i] = cond[oc(i)] ? a[oa(i)] : b[ob(i)] over the collapsed broadcast shape (<= 8 dims).
template <typename T>
__global__ void where_broadcast(const bool* __restrict__ cond, const T* __restrict__ a,
                                const T* __restrict__ b, T* __restrict__ out, long long n,
                                int ndim, GP_DIMS_PARAMS(s), GP_DIMS_PARAMS(sc),
                                GP_DIMS_PARAMS(sa), GP_DIMS_PARAMS(sb)) {
    const long long shp[8] = GP_DIMS_ARRAY(s);
    const long long strc[8] = GP_DIMS_ARRAY(sc);
    const long long stra[8] = GP_DIMS_ARRAY(sa);
    const long long strb[8] = GP_DIMS_ARRAY(sb);
    for (long long i = gp::thread_index(); i < n; i += gp::grid_stride()) {
        long long oc, oa, ob;
        where_offsets(i, ndim, shp, strc, stra, strb, oc, oa, ob);
        out[i] = cond[oc] ? a[oa] : b[ob];
    }
}

// y[n, i, j] = x[n, i, j] where j - i <= k (lower) or j - i >= k (UPPER), else zero.
template <typename T, bool UPPER>
__global__ void triangle(const T* __restrict__ x, T* __restrict__ y, long long total,
                         long long rows, long long cols, long long k) {
    for (long long e = gp::thread_index(); e < total; e += gp::grid_stride()) {
        const long long j = e % cols;
        const long long i = (e / cols) % rows;
        const bool keep = UPPER ? j - i >= k : j - i <= k;
        y[e] = keep ? x[e] : T();  // T(): value-initialized, all-zero bits (0, +0.0, false)
    }
}

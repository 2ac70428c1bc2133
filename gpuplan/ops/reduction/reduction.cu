// Reductions (sum / max / min / prod over axes) and the one-launch global L2 norm.
// Tin/Tout: float, double, __half, __nv_bfloat16 (partials in the accumulator type).
// OP: a `Combine` enumerator. SUM: the result is divided by `divisor` (1 for sum, the count
// for mean, -1 for a negated sum); MAX, MIN: NaN-propagating like NumPy; PROD: products in
// the accumulator type.
// `Combine` and `NormType` come from the Python tables (gpuplan/ops/reduction/launch.py:
// REDUCTIONS, NORM_DTYPES) through -DGPUPLAN_ENUM_*: an `if constexpr` chain without a
// branch for a table row fails its static_assert.
// Every kernel fixes its order of combination by the problem alone (logical element index,
// constant block sizes): results do not depend on the grid size or the device.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_common.cuh"

enum Combine { GPUPLAN_ENUM_Combine };
enum NormType { GPUPLAN_ENUM_NormType, NORM_TYPE_COUNT };

namespace {

template <int OP> constexpr bool unknown_combine = OP < 0;

template <int OP, typename A> __device__ __forceinline__ A red_init() {
    if constexpr (OP == SUM) {
        return A(0);
    } else if constexpr (OP == MAX || OP == MIN) {
        // -inf for max, +inf for min.
        if constexpr (sizeof(A) == 4) {
            const float inf = __int_as_float(0x7f800000);
            return OP == MAX ? -inf : inf;
        } else {
            const double inf = __longlong_as_double(0x7ff0000000000000LL);
            return OP == MAX ? -inf : inf;
        }
    } else if constexpr (OP == PROD) {
        return A(1);
    } else {
        static_assert(unknown_combine<OP>, "combine without a CUDA identity");
        return A(0);
    }
}

// NaN-propagating max and min (NumPy semantics); plain addition and multiplication.
template <int OP, typename A> __device__ __forceinline__ A red_combine(A acc, A v) {
    if constexpr (OP == SUM) {
        return acc + v;
    } else if constexpr (OP == MAX) {
        if (acc != acc) return acc;
        if (v != v) return v;
        return v > acc ? v : acc;
    } else if constexpr (OP == MIN) {
        if (acc != acc) return acc;
        if (v != v) return v;
        return v < acc ? v : acc;
    } else if constexpr (OP == PROD) {
        return acc * v;
    } else {
        static_assert(unknown_combine<OP>, "combine without CUDA math");
        return acc;
    }
}

template <int OP, typename A> __device__ __forceinline__ A red_finish(A acc, A divisor) {
    if constexpr (OP == SUM) {
        return acc / divisor;
    } else {
        return acc;
    }
}

// Convert anything (float dtypes) to the accumulator A and back.
template <typename A, typename T> __device__ __forceinline__ A load_as(T v) {
    return static_cast<A>(gp::to_acc<T>(v));
}
template <typename T, typename A> __device__ __forceinline__ T store_as(A v) {
    return gp::from_acc<T>(static_cast<typename gp::acc_type<T>::type>(v));
}

template <int OP, typename A> __device__ __forceinline__ A warp_combine(A v) {
    // Butterfly: every lane ends with the same value, combined in a fixed pattern.
    for (int o = 16; o > 0; o >>= 1) v = red_combine<OP, A>(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };


}  // namespace

// Row reduction of x [rows, cols]. Each row is cut into S segments of L elements (S == 1,
// L == cols: one segment per row); y[v] for v over [rows, S] reduces segment v % S of row
// v / S. With S > 1 a second call reduces the [rows, S] partials. TPR threads per segment
// (32: a warp, 256: the block); launch with blockDim.x == 256. Thread t of a segment owns
// the chunks c = t, t + TPR, ... of VEC consecutive elements and combines them in ascending
// order; the TPR partials are then combined in a fixed tree. Chunks are loaded 16 bytes at a
// time when aligned (same order either way: the bits do not depend on the address).
template <typename Tin, typename Tout, int OP, int TPR>
__global__ void __launch_bounds__(256) reduce_rows(const Tin* __restrict__ x, Tout* __restrict__ y,
                                                   long long rows, long long cols, long long S,
                                                   long long L,
                                                   typename gp::acc_type<Tout>::type divisor) {
    using A = typename gp::acc_type<Tout>::type;
    constexpr int VEC = 16 / sizeof(Tin);
    constexpr int ROWS_PER_BLOCK = 256 / TPR;
    __shared__ A smem[8];
    const int lane = threadIdx.x % TPR;
    const long long n_seg = rows * S;
    // Every thread of a block runs the same number of iterations (TPR == 256 syncs inside).
    for (long long base = (long long)blockIdx.x * ROWS_PER_BLOCK; base < n_seg;
         base += (long long)gridDim.x * ROWS_PER_BLOCK) {
        const long long v = base + threadIdx.x / TPR;
        A acc = red_init<OP, A>();
        if (v < n_seg) {
            const long long start = (v % S) * L;
            const long long len = (start + L < cols) ? L : cols - start;
            const Tin* xr = x + (v / S) * cols + start;
            const bool aligned = (reinterpret_cast<unsigned long long>(xr) % (VEC * sizeof(Tin))) == 0;
            const long long n_chunks = (len + VEC - 1) / VEC;
            for (long long c = lane; c < n_chunks; c += TPR) {
                const long long c0 = c * VEC;
                if (aligned && c0 + VEC <= len) {
                    const Pack<Tin, VEC> p = *reinterpret_cast<const Pack<Tin, VEC>*>(xr + c0);
#pragma unroll
                    for (int j = 0; j < VEC; ++j) acc = red_combine<OP, A>(acc, load_as<A>(p.v[j]));
                } else {
                    const long long c1 = c0 + VEC < len ? c0 + VEC : len;
                    for (long long i = c0; i < c1; ++i) acc = red_combine<OP, A>(acc, load_as<A>(xr[i]));
                }
            }
        }
        acc = warp_combine<OP, A>(acc);
        if constexpr (TPR == 256) {
            __syncthreads();  // smem is reused across loop iterations
            if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = acc;
            __syncthreads();
            if (threadIdx.x == 0 && v < n_seg) {
                A t = smem[0];
#pragma unroll
                for (int w = 1; w < 8; ++w) t = red_combine<OP, A>(t, smem[w]);
                y[v] = store_as<Tout>(red_finish<OP, A>(t, divisor));
            }
        } else {
            if (lane == 0 && v < n_seg) y[v] = store_as<Tout>(red_finish<OP, A>(acc, divisor));
        }
    }
}

// x viewed as [outer, R, inner]; the R axis is cut into S splits of L rows. Output t over
// [outer, S, inner] (contiguous): y[t] = reduce over r in split s, ascending r. With S == 1
// this is the final result; otherwise a second call reduces the S partials (R = L = S).
// Adjacent threads own adjacent inner positions: loads are coalesced.
template <typename Tin, typename Tout, int OP>
__global__ void __launch_bounds__(256) reduce_cols(const Tin* __restrict__ x, Tout* __restrict__ y,
                                                   long long outer, long long R, long long inner,
                                                   long long S, long long L,
                                                   typename gp::acc_type<Tout>::type divisor) {
    using A = typename gp::acc_type<Tout>::type;
    const long long n_out = outer * S * inner;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n_out; t += step) {
        const long long k = t % inner;
        const long long os = t / inner;
        const long long s = os % S;
        const long long o = os / S;
        const long long r0 = s * L;
        const long long r1 = (r0 + L < R) ? r0 + L : R;
        const Tin* src = x + (o * R) * inner + k;
        A acc = red_init<OP, A>();
        for (long long r = r0; r < r1; ++r) acc = red_combine<OP, A>(acc, load_as<A>(src[r * inner]));
        y[t] = store_as<Tout>(red_finish<OP, A>(acc, divisor));
    }
}

// General reduction over a strided view: dims [0, nk) are kept (output in C order), dims
// [nk, nk + nr) are reduced; shape s*, element strides st*. One thread per output element
// combines its n_red inputs sequentially in C order of the reduced dims.
template <typename Tin, typename Tout, int OP>
__global__ void __launch_bounds__(256) reduce_general(const Tin* __restrict__ x, Tout* __restrict__ y,
                                                      long long n_out, long long n_red, int nk, int nr,
                                                      GP_DIMS_PARAMS(s), GP_DIMS_PARAMS(st),
                                                      typename gp::acc_type<Tout>::type divisor) {
    using A = typename gp::acc_type<Tout>::type;
    const long long shp[8] = GP_DIMS_ARRAY(s);
    const long long str[8] = GP_DIMS_ARRAY(st);
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < n_out; o += step) {
        long long off = gp::kept_offset(o, nk, shp, str);
        long long idx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        A acc = red_init<OP, A>();
        for (long long r = 0; r < n_red; ++r) {
            acc = red_combine<OP, A>(acc, load_as<A>(x[off]));
            bool carry = true;  // odometer step over the reduced dims, last dim fastest
#pragma unroll
            for (int d = 7; d >= 0; --d) {
                if (carry && d >= nk && d < nk + nr) {
                    off += str[d];
                    if (++idx[d] == shp[d]) {
                        idx[d] = 0;
                        off -= str[d] * shp[d];
                    } else {
                        carry = false;
                    }
                }
            }
        }
        y[o] = store_as<Tout>(red_finish<OP, A>(acc, divisor));
    }
}

// Global L2 norm of many tensors in one launch. `table` (int64): ptr[n], size[n], code[n]
// (a NormType), chunk_prefix[n + 1], then one zeroed counter.
// Every tensor is cut into chunks of kNormChunk elements (GPUPLAN_NORM_CHUNK, set from
// Python); chunk g's sums of squares are computed by one block (thread t takes elements t,
// t + 256, ..., then a fixed tree) and stored in partials[3g .. 3g + 2]. The last block to
// finish (atomic ticket) sums the partials in a fixed order and writes the norm to out[0]:
// deterministic and independent of the grid size.
// Overflow- and underflow-safe (issue 11: 1e20 float32 values gave inf): Blue's scaled sum
// of squares as LAPACK's dnrm2 does it, in double whatever the element type. Squares of
// |x| > 2^486 are summed scaled by 2^-538, of |x| < 2^-511 scaled by 2^537 (powers of two:
// exact), the rest as they are; NaN lands in the middle sum and propagates, inf in the big
// one. float/half elements are always in the middle range, so they cost one compare more.
constexpr long long kNormChunk = GPUPLAN_NORM_CHUNK;
static_assert(NORM_TYPE_COUNT == 4, "a NormType row without a load in norm_elem");
constexpr double kNormTsml = 0x1p-511, kNormTbig = 0x1p486;
constexpr double kNormSsml = 0x1p537, kNormSbig = 0x1p-538;

__device__ __forceinline__ double norm_elem(const void* p, long long code, long long i) {
    if (code == F32) return static_cast<double>(static_cast<const float*>(p)[i]);
    if (code == F64) return static_cast<const double*>(p)[i];
    if (code == F16) return static_cast<double>(__half2float(static_cast<const __half*>(p)[i]));
    return static_cast<double>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));  // BF16
}

// (small, middle, big) sums -> the norm, LAPACK's combination; a NaN middle sum propagates.
__device__ __forceinline__ double norm_combine(double sml, double med, double big) {
    const bool has_med = med > 0.0 || med != med;
    if (big > 0.0) {
        if (has_med) big += (med * kNormSbig) * kNormSbig;
        return sqrt(big) / kNormSbig;
    }
    if (sml > 0.0) {
        if (!has_med) return sqrt(sml) / kNormSsml;
        const double ymed = sqrt(med), ysml = sqrt(sml) / kNormSsml;
        const double ymin = ysml > ymed ? ymed : ysml, ymax = ysml > ymed ? ysml : ymed;
        const double r = ymin / ymax;
        return ymax * sqrt(1.0 + r * r);
    }
    return sqrt(med);
}

template <typename A> __device__ A block_sum256(A v, A* smem) {
    v = warp_combine<SUM, A>(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
    __syncthreads();
    A t = smem[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) t += smem[w];
    return t;  // the same value in every thread
}

// A: the output type (float, double); partials: 3 doubles per chunk (small, middle, big).
template <typename A>
__global__ void __launch_bounds__(256) global_l2_norm(long long* __restrict__ table, int n,
                                                      double* __restrict__ partials,
                                                      A* __restrict__ out) {
    __shared__ double smem[8];
    __shared__ bool am_last;
    const long long* ptrs = table;
    const long long* sizes = table + n;
    const long long* codes = table + 2 * n;
    const long long* prefix = table + 3 * n;
    unsigned int* counter = reinterpret_cast<unsigned int*>(table + 4 * n + 1);
    const long long n_chunks = prefix[n];
    for (long long g = blockIdx.x; g < n_chunks; g += gridDim.x) {
        int lo = 0, hi = n - 1;  // tensor holding chunk g: last i with prefix[i] <= g
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (prefix[mid] <= g) lo = mid; else hi = mid - 1;
        }
        const void* p = reinterpret_cast<const void*>(ptrs[lo]);
        const long long start = (g - prefix[lo]) * kNormChunk;
        const long long end = start + kNormChunk < sizes[lo] ? start + kNormChunk : sizes[lo];
        const long long code = codes[lo];
        double sml = 0.0, med = 0.0, big = 0.0;
        for (long long i = start + threadIdx.x; i < end; i += 256) {
            const double v = norm_elem(p, code, i), ax = fabs(v);
            if (ax > kNormTbig) {
                const double s = v * kNormSbig;
                big += s * s;
            } else if (ax < kNormTsml) {
                const double s = v * kNormSsml;
                sml += s * s;
            } else {
                med += v * v;  // NaN too
            }
        }
        sml = block_sum256<double>(sml, smem);
        med = block_sum256<double>(med, smem);
        big = block_sum256<double>(big, smem);
        if (threadIdx.x == 0) {
            partials[3 * g] = sml;
            partials[3 * g + 1] = med;
            partials[3 * g + 2] = big;
        }
    }
    // Publish this block's partials, then take a ticket; the last block finishes.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) am_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!am_last) return;
    __threadfence();
    const volatile double* vp = partials;
    double sml = 0.0, med = 0.0, big = 0.0;
    for (long long g = threadIdx.x; g < n_chunks; g += 256) {
        sml += vp[3 * g];
        med += vp[3 * g + 1];
        big += vp[3 * g + 2];
    }
    sml = block_sum256<double>(sml, smem);
    med = block_sum256<double>(med, smem);
    big = block_sum256<double>(big, smem);
    if (threadIdx.x == 0) out[0] = static_cast<A>(norm_combine(sml, med, big));
}

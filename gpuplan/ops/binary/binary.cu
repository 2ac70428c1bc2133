// Binary kernels: c = a op b with NumPy broadcasting (bool c for the comparisons), the
// gradient terms of op, and the row-broadcast bias add. T: float, double, __half,
// __nv_bfloat16, and (forward, broadcast kernel only) int, long long and bool; math runs in
// gp::Acc<T> (f32 for halves). Integer add/sub/mul/negation run in the unsigned type: they
// wrap around like torch's, where signed overflow would be undefined behaviour.
// Contiguous kernels take `vec_ok` (every pointer aligned to a 16-byte pack, checked on the
// host) and then move 16 bytes per load and store; the tail and the unaligned case use
// scalar accesses. All loops are grid-stride, 64-bit.
//
// The enumerators of `BinaryOp` come from the Python table (gpuplan/ops/binary/table.py,
// BINARY_OPS) through -DGPUPLAN_ENUM_BinaryOp: a table row without a branch below fails to
// compile (the static_assert), a branch whose row is gone names an undeclared value.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_map.cuh"

namespace {

using gp::Acc;
using gp::ld;
using gp::Pack;
using gp::st;

enum BinaryOp { GPUPLAN_ENUM_BinaryOp };

template <int OP> constexpr bool unknown_op = OP < 0;

// Integer types (no <type_traits> under NVRTC) and the unsigned type their wrapping math
// runs in; floats map to themselves.
template <typename A> constexpr bool is_int = false;
template <> constexpr bool is_int<int> = true;
template <> constexpr bool is_int<long long> = true;
template <typename A> struct wrap_type { typedef A type; };
template <> struct wrap_type<int> { typedef unsigned int type; };
template <> struct wrap_type<long long> { typedef unsigned long long type; };
template <typename A> using W = typename wrap_type<A>::type;

__device__ __forceinline__ float m_fmod(float x, float y) { return fmodf(x, y); }
__device__ __forceinline__ double m_fmod(double x, double y) { return fmod(x, y); }
__device__ __forceinline__ float m_floor(float x) { return floorf(x); }
__device__ __forceinline__ double m_floor(double x) { return floor(x); }
__device__ __forceinline__ float m_copysign(float x, float y) { return copysignf(x, y); }
__device__ __forceinline__ double m_copysign(double x, double y) { return copysign(x, y); }

// a // b rounded toward -inf. Integers: x // 0 = 0 (NumPy) and INT_MIN // -1 wraps (the
// hardware division would trap). Floats: torch's div_floor, exact quotient of a - fmod(a, b).
template <typename A> __device__ __forceinline__ A floor_div(A a, A b) {
    if constexpr (is_int<A>) {
        if (b == A(0)) return A(0);
        if (b == A(-1)) return A(W<A>(0) - W<A>(a));
        const A q = a / b;
        return a % b != A(0) && ((a < A(0)) != (b < A(0))) ? A(q - A(1)) : q;
    } else {
        if (b == A(0)) return a / b;
        const A mod = m_fmod(a, b);
        A div = (a - mod) / b;
        if (mod != A(0) && ((b < A(0)) != (mod < A(0)))) div -= A(1);
        if (div == A(0)) return m_copysign(A(0), a / b);
        A fl = m_floor(div);
        if (div - fl > A(0.5)) fl += A(1);
        return fl;
    }
}

// a % b with the sign of b (torch.remainder). Integers: x % 0 = 0 and x % -1 = 0.
template <typename A> __device__ __forceinline__ A remainder(A a, A b) {
    if constexpr (is_int<A>) {
        if (b == A(0) || b == A(-1)) return A(0);
        const A r = a % b;
        return r != A(0) && ((r < A(0)) != (b < A(0))) ? A(r + b) : r;
    } else {
        const A m = m_fmod(a, b);
        return m != A(0) && ((b < A(0)) != (m < A(0))) ? m + b : m;
    }
}

template <int OP, typename A> __device__ __forceinline__ A binary_op(A a, A b) {
    if constexpr (OP == ADD) {
        return A(W<A>(a) + W<A>(b));
    } else if constexpr (OP == SUB) {
        return A(W<A>(a) - W<A>(b));
    } else if constexpr (OP == MUL) {
        return A(W<A>(a) * W<A>(b));
    } else if constexpr (OP == DIV) {
        return a / b;
    } else if constexpr (OP == POW) {
        return gp::m_pow(a, b);  // C pow: pow(x, 0) = 1 and pow(1, y) = 1, even for NaN
    } else if constexpr (OP == MAXIMUM) {
        return a != a || a > b ? a : b;  // NaN on either side propagates (torch.maximum)
    } else if constexpr (OP == MINIMUM) {
        return a != a || a < b ? a : b;
    } else if constexpr (OP == REMAINDER) {
        return remainder(a, b);
    } else if constexpr (OP == FLOOR_DIVIDE) {
        return floor_div(a, b);
    } else if constexpr (OP == BITWISE_AND) {  // on bool: logical and (likewise or, xor)
        return A(a & b);
    } else if constexpr (OP == BITWISE_OR) {
        return A(a | b);
    } else if constexpr (OP == BITWISE_XOR) {
        return A(a ^ b);
    } else {
        static_assert(unknown_op<OP>, "binary op without CUDA forward math");
        return a;
    }
}

// Comparisons: a bool result (IEEE: every one is false on NaN but NE), no gradient.
template <int OP>
constexpr bool is_compare = OP == LT || OP == LE || OP == GT || OP == GE || OP == EQ || OP == NE;

template <int OP, typename A> __device__ __forceinline__ bool compare_op(A a, A b) {
    if constexpr (OP == LT) {
        return a < b;
    } else if constexpr (OP == LE) {
        return a <= b;
    } else if constexpr (OP == GT) {
        return a > b;
    } else if constexpr (OP == GE) {
        return a >= b;
    } else if constexpr (OP == EQ) {
        return a == b;
    } else {
        return a != b;
    }
}

// The element type of c: bool for a comparison, else T.
template <bool COMPARE, typename T> struct out_type { typedef T type; };
template <typename T> struct out_type<true, T> { typedef bool type; };
template <typename T, int OP> using Out = typename out_type<is_compare<OP>, T>::type;

template <typename T, int OP> __device__ __forceinline__ Out<T, OP> apply_op(Acc<T> a, Acc<T> b) {
    if constexpr (is_compare<OP>) {
        return compare_op<OP>(a, b);
    } else {
        return st<T>(binary_op<OP>(a, b));
    }
}

// Whether the gradient terms of OP read the operands (add/sub: dc alone; remainder reads them
// for b's term).
template <int OP> constexpr bool grad_reads_operands = OP != ADD && OP != SUB;

// Gradient term of c = op(a, b) with respect to a (WHICH == 0) or b (WHICH == 1).
template <int OP, int WHICH, typename A> __device__ __forceinline__ A binary_grad_term(A a, A b,
                                                                                      A dc) {
    if constexpr (OP == ADD) {
        return dc;
    } else if constexpr (OP == SUB) {
        return WHICH == 0 ? dc : -dc;
    } else if constexpr (OP == MUL) {
        return WHICH == 0 ? dc * b : dc * a;
    } else if constexpr (OP == DIV) {
        return WHICH == 0 ? dc / b : -dc * a / (b * b);
    } else if constexpr (OP == POW) {
        // torch: 0 where the exponent is 0, and (for b) where a == 0 and b >= 0
        if constexpr (WHICH == 0) return b == A(0) ? A(0) : dc * b * gp::m_pow(a, b - A(1));
        return a == A(0) && b >= A(0) ? A(0) : dc * gp::m_pow(a, b) * gp::m_log(a);
    } else if constexpr (OP == MAXIMUM || OP == MINIMUM) {
        // torch: half of dc to each side on a tie, none to the side that loses
        const A x = WHICH == 0 ? a : b, y = WHICH == 0 ? b : a;
        const bool loses = OP == MAXIMUM ? x < y : x > y;
        return x == y ? A(0.5) * dc : (loses ? A(0) : dc);
    } else if constexpr (OP == REMAINDER) {
        return WHICH == 0 ? dc : -dc * floor_div(a, b);  // torch: -dc * floor(a / b) for b
    } else {
        static_assert(unknown_op<OP>, "binary op without CUDA gradient math");
        return dc;
    }
}

// Offsets into a and b of the output element i (C order over the collapsed shape `shp`,
// element strides sa/sb, 0 on broadcast dims).
__device__ __forceinline__ void broadcast_offsets(long long i, int ndim, const long long* shp,
                                                  const long long* sa, const long long* sb,
                                                  long long& oa, long long& ob) {
    if (ndim <= 1) {
        oa = i * sa[0];
        ob = i * sb[0];
        return;
    }
    oa = 0;
    ob = 0;
#pragma unroll
    for (int d = 7; d >= 0; --d) {
        if (d < ndim) {
            const long long q = i / shp[d];
            const long long r = i - q * shp[d];
            oa += r * sa[d];
            ob += r * sb[d];
            i = q;
        }
    }
}

}  // namespace

// c = op(a, b) for same-shape contiguous operands.
template <typename T, int OP>
__global__ void binary_contiguous(const T* __restrict__ a, const T* __restrict__ b,
                                  Out<T, OP>* __restrict__ c, long long n, int vec_ok) {
    using C = Out<T, OP>;
    constexpr int N = 16 / sizeof(T);
    long long head = 0;
    if (vec_ok) {
        const long long np = n / N;
        const Pack<T, N>* ap = reinterpret_cast<const Pack<T, N>*>(a);
        const Pack<T, N>* bp = reinterpret_cast<const Pack<T, N>*>(b);
        Pack<C, N>* cp = reinterpret_cast<Pack<C, N>*>(c);
        for (long long p = gp::thread_index(); p < np; p += gp::grid_stride()) {
            const Pack<T, N> av = ap[p], bv = bp[p];
            Pack<C, N> out;
#pragma unroll
            for (int j = 0; j < N; ++j) out.v[j] = apply_op<T, OP>(ld(av.v[j]), ld(bv.v[j]));
            cp[p] = out;
        }
        head = np * N;
    }
    for (long long i = head + gp::thread_index(); i < n; i += gp::grid_stride()) {
        c[i] = apply_op<T, OP>(ld(a[i]), ld(b[i]));
    }
}

// c[i] = op(a[oa(i)], b[ob(i)]) over the collapsed broadcast shape (at most 8 dims).
template <typename T, int OP>
__global__ void binary_broadcast(const T* __restrict__ a, const T* __restrict__ b,
                                 Out<T, OP>* __restrict__ c, long long n, int ndim,
                                 GP_DIMS_PARAMS(s),
                                 GP_DIMS_PARAMS(sa), GP_DIMS_PARAMS(sb)) {
    const long long shp[8] = GP_DIMS_ARRAY(s);
    const long long stra[8] = GP_DIMS_ARRAY(sa);
    const long long strb[8] = GP_DIMS_ARRAY(sb);
    for (long long i = gp::thread_index(); i < n; i += gp::grid_stride()) {
        long long oa, ob;
        broadcast_offsets(i, ndim, shp, stra, strb, oa, ob);
        c[i] = apply_op<T, OP>(ld(a[oa]), ld(b[ob]));
    }
}

// out[i] = d op(a, b) / d(a or b) * dc[i] over the output shape, as Tout (T, or the
// accumulator type when a reduction to the operand's shape follows). a/b are read only by
// mul and div.
template <typename T, typename Tout, int OP, int WHICH>
__global__ void binary_grad(const T* __restrict__ a, const T* __restrict__ b,
                            const T* __restrict__ dc, Tout* __restrict__ out, long long n, int ndim,
                            GP_DIMS_PARAMS(s), GP_DIMS_PARAMS(sa), GP_DIMS_PARAMS(sb)) {
    using A = Acc<T>;
    const long long shp[8] = GP_DIMS_ARRAY(s);
    const long long stra[8] = GP_DIMS_ARRAY(sa);
    const long long strb[8] = GP_DIMS_ARRAY(sb);
    for (long long i = gp::thread_index(); i < n; i += gp::grid_stride()) {
        A av = A(0), bv = A(0);
        if constexpr (grad_reads_operands<OP>) {
            long long oa, ob;
            broadcast_offsets(i, ndim, shp, stra, strb, oa, ob);
            av = ld(a[oa]);
            bv = ld(b[ob]);
        }
        const A g = binary_grad_term<OP, WHICH>(av, bv, ld(dc[i]));
        out[i] = gp::from_acc<Tout>(static_cast<Acc<Tout>>(g));
    }
}

// y[r, j] = x[r, j] + bias[j] for x [rows, n]. vec_ok also requires n % N == 0, so a pack
// never straddles two rows and its bias slice is aligned.
template <typename T>
__global__ void bias_add(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                         long long total, long long n, int vec_ok) {
    constexpr int N = 16 / sizeof(T);
    if (vec_ok) {
        const long long np = total / N;
        const Pack<T, N>* xp = reinterpret_cast<const Pack<T, N>*>(x);
        Pack<T, N>* yp = reinterpret_cast<Pack<T, N>*>(y);
        for (long long p = gp::thread_index(); p < np; p += gp::grid_stride()) {
            const long long j0 = (p * N) % n;
            const Pack<T, N> xv = xp[p];
            const Pack<T, N> bv = *reinterpret_cast<const Pack<T, N>*>(bias + j0);
            Pack<T, N> out;
#pragma unroll
            for (int j = 0; j < N; ++j) out.v[j] = st<T>(ld(xv.v[j]) + ld(bv.v[j]));
            yp[p] = out;
        }
        return;
    }
    for (long long i = gp::thread_index(); i < total; i += gp::grid_stride()) {
        y[i] = st<T>(ld(x[i]) + ld(bias[i % n]));
    }
}

// Emulated-device header: included (g++ -include) before every kernel source that the
// emulator compiles for the host. It gives CUDA C's qualifiers, built-in variables and
// intrinsics a host meaning; every operation that involves other threads (barriers, warp
// collectives, the emulated PTX instructions, shared memory) is a call into the emulator
// runtime (runtime.cpp), which runs each CUDA thread as a fiber.
//
// What stays the kernel's own: its C++ source, its arithmetic (host libm, see README), its
// memory accesses (instrumented and bounds-checked by the runtime) and its inline PTX,
// which the build step (ptx.py) turns into calls of the __emu_ptx_* functions below, chosen
// by each instruction's exact text.
#pragma once

#include "emu_abi.h"

// Qualifiers first: crt/host_defines.h keeps definitions made before it on a host compiler.
#define __host__
#define __device__
#define __global__ __attribute__((noinline, used))
#define __constant__
#define __managed__
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
// Every __shared__ declaration is rewritten by the build step; one that is left over is an
// error rather than a silently thread-private variable.
#define __shared__ __gpuplan_emulator_found_an_untransformed_shared_declaration

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmath>
#include <type_traits>

#undef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#undef __restrict__
#define __restrict__ __restrict
#undef __align__
#define __align__(n) __attribute__((aligned(n)))

// The emulated device is an sm_80 part: the PTX the kernels guard with __CUDA_ARCH__ >= 800
// is what runs. Defined after the half headers, which must see a host compilation.
#define __CUDA_ARCH__ 800
#define __CUDACC_RTC__ 1
#define GPUPLAN_EMULATED 1

// -- built-in variables --------------------------------------------------------------------
struct __emu_thread_view { uint3 tid; };
#define threadIdx (reinterpret_cast<const __emu_thread_view*>(__emu_cur)->tid)
#define blockIdx (*reinterpret_cast<const uint3*>(&__emu_block_idx))
#define blockDim (*reinterpret_cast<const dim3*>(&__emu_block_dim))
#define gridDim (*reinterpret_cast<const dim3*>(&__emu_grid_dim))
#define warpSize 32

// -- synchronization -------------------------------------------------------------------------
inline void __syncthreads() { __emu_barrier(EMU_BAR_SYNC, 0); }
inline int __syncthreads_count(int p) { return __emu_barrier(EMU_BAR_COUNT, p != 0); }
inline int __syncthreads_and(int p) { return __emu_barrier(EMU_BAR_AND, p != 0); }
inline int __syncthreads_or(int p) { return __emu_barrier(EMU_BAR_OR, p != 0); }
// Fibers of one block share one OS thread: fences only need to stop compiler reordering.
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap() { __emu_trap(); }
inline void __brkpt() { __emu_trap(); }

// -- warp collectives (every lane of the warp must arrive with the full mask) ------------
template <typename T> inline T __emu_shfl(int kind, unsigned mask, T v, int a, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "__shfl_*_sync: a value of at most 8 bytes");
    T out;
    __emu_warp_op(kind, mask, &v, &out, sizeof(T), a, width);
    return out;
}
template <typename T> inline T __shfl_sync(unsigned m, T v, int src, int w = 32) {
    return __emu_shfl(EMU_WARP_SHFL_IDX, m, v, src, w);
}
template <typename T> inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) {
    return __emu_shfl(EMU_WARP_SHFL_UP, m, v, static_cast<int>(d), w);
}
template <typename T> inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) {
    return __emu_shfl(EMU_WARP_SHFL_DOWN, m, v, static_cast<int>(d), w);
}
template <typename T> inline T __shfl_xor_sync(unsigned m, T v, int lane_mask, int w = 32) {
    return __emu_shfl(EMU_WARP_SHFL_XOR, m, v, lane_mask, w);
}
inline unsigned __ballot_sync(unsigned m, int p) {
    int v = p != 0;
    unsigned out;
    __emu_warp_op(EMU_WARP_BALLOT, m, &v, &out, sizeof(int), 0, 32);
    return out;
}
inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0u; }
inline int __all_sync(unsigned m, int p) { return __ballot_sync(m, p) == m; }
inline void __syncwarp(unsigned m = 0xffffffffu) {
    int v = 0;
    __emu_warp_op(EMU_WARP_SYNC, m, &v, &v, sizeof(int), 0, 32);
}
// Every existing lane of the warp: the emulator does not track divergence.
inline unsigned __activemask() { return __emu_lane_mask(); }

// -- address spaces ------------------------------------------------------------------------
inline size_t __cvta_generic_to_shared(const void* p) { return __emu_cvta_shared(p); }
inline unsigned __isShared(const void* p) { return __emu_is_shared(p); }
inline unsigned __isGlobal(const void* p) { return !__emu_is_shared(p); }

// -- atomics: one OS thread runs a block's fibers, so read-modify-write is atomic; accesses
// inside an atomic are not races (the scope tells the runtime's race check) --------------
struct __emu_atomic_scope {
    __emu_atomic_scope() { ++__emu_atomic_depth; }
    ~__emu_atomic_scope() { --__emu_atomic_depth; }
};
#define __EMU_ATOMIC(name, update)                                                            \
    template <typename T> inline T name(T* p, T v) {                                          \
        __emu_atomic_scope scope;                                                             \
        T old = *p;                                                                           \
        *p = update;                                                                          \
        return old;                                                                           \
    }
__EMU_ATOMIC(atomicAdd, old + v)
__EMU_ATOMIC(atomicSub, old - v)
__EMU_ATOMIC(atomicExch, v)
__EMU_ATOMIC(atomicMax, old < v ? v : old)
__EMU_ATOMIC(atomicMin, v < old ? v : old)
__EMU_ATOMIC(atomicAnd, old & v)
__EMU_ATOMIC(atomicOr, old | v)
__EMU_ATOMIC(atomicXor, old ^ v)
#undef __EMU_ATOMIC
template <typename T> inline T atomicCAS(T* p, T cmp, T v) {
    __emu_atomic_scope scope;
    T old = *p;
    if (old == cmp) *p = v;
    return old;
}
inline unsigned atomicInc(unsigned* p, unsigned lim) {
    __emu_atomic_scope scope;
    unsigned old = *p;
    *p = old >= lim ? 0u : old + 1u;
    return old;
}

// -- integer and bit intrinsics ------------------------------------------------------------
inline unsigned __umulhi(unsigned a, unsigned b) {
    return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __mulhi(int a, int b) {
    return static_cast<int>((static_cast<long long>(a) * b) >> 32);
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) {
    return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
    return (x >> 16) | (x << 16);
}
template <typename To, typename From> inline To __emu_bits(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between equal sizes");
    To t;
    memcpy(&t, &v, sizeof(To));
    return t;
}
inline float __int_as_float(int x) { return __emu_bits<float>(x); }
inline int __float_as_int(float x) { return __emu_bits<int>(x); }
inline float __uint_as_float(unsigned x) { return __emu_bits<float>(x); }
inline unsigned __float_as_uint(float x) { return __emu_bits<unsigned>(x); }
inline double __longlong_as_double(long long x) { return __emu_bits<double>(x); }
inline long long __double_as_longlong(double x) { return __emu_bits<long long>(x); }
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }
inline long long clock64() { return static_cast<long long>(__builtin_ia32_rdtsc()); }
inline void __nanosleep(unsigned) {}

// -- float intrinsics: the host's correctly rounded operations stand in for CUDA's ---------
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f)); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float exp10f(float x) { return powf(10.0f, x); }
inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
inline double normcdf(double x) { return 0.5 * erfc(-x * 0.70710678118654752); }
inline int __float2int_rn(float x) { return static_cast<int>(nearbyintf(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __double2int_rn(double x) { return static_cast<int>(nearbyint(x)); }
inline long long __float2ll_rn(float x) { return static_cast<long long>(nearbyintf(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
// CUDA's global min/max overloads (the device math library's), for the common types.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// -- emulated PTX: operand conversions used by the code ptx.py generates ------------------
template <typename T> inline uint32_t __emu_ptx_r(const T& v) {
    if constexpr (std::is_pointer<T>::value) {
        return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(v));
    } else {
        return static_cast<uint32_t>(v);
    }
}
template <typename T> inline uint64_t __emu_ptx_l(const T& v) {
    if constexpr (std::is_pointer<T>::value) {
        return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(v));
    } else {
        return static_cast<uint64_t>(v);
    }
}
template <typename T> inline float __emu_ptx_f(const T& v) { return static_cast<float>(v); }
template <typename T> inline double __emu_ptx_d(const T& v) { return static_cast<double>(v); }
template <typename T> inline uint16_t __emu_ptx_h(const T& v) {
    if constexpr (sizeof(T) == 2 && !std::is_integral<T>::value) {
        return __emu_bits<uint16_t>(v);
    } else {
        return static_cast<uint16_t>(v);
    }
}

// -- kernel entry table --------------------------------------------------------------------
template <typename P> constexpr int __emu_param_kind() {
    using U = std::remove_cv_t<P>;
    if constexpr (std::is_pointer<U>::value) return EMU_PARAM_POINTER;
    else if constexpr (std::is_same<U, bool>::value) return EMU_PARAM_BOOL;
    else if constexpr (std::is_integral<U>::value && std::is_signed<U>::value) return EMU_PARAM_INT;
    else if constexpr (std::is_integral<U>::value) return EMU_PARAM_UINT;
    else if constexpr (std::is_floating_point<U>::value) return EMU_PARAM_FLOAT;
    else return EMU_PARAM_OTHER;
}
template <auto F> struct __emu_invoker;
template <typename... P, void (*F)(P...)> struct __emu_invoker<F> {
    static constexpr int count = static_cast<int>(sizeof...(P));
    static constexpr int sizes[sizeof...(P) + 1] = {static_cast<int>(sizeof(P))..., 0};
    static constexpr int kinds[sizeof...(P) + 1] = {__emu_param_kind<P>()..., 0};
    // Reads the packed argument values: not a kernel access, so not bounds-checked.
    __attribute__((no_sanitize_address, noinline)) static void call(void** args) {
        call_with(args, std::index_sequence_for<P...>{});
    }
    template <size_t... I>
    __attribute__((no_sanitize_address)) static void call_with(void** args,
                                                              std::index_sequence<I...>) {
        F(*static_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(args[I])...);
    }
};
#define __EMU_ENTRY(name, ...)                                                            \
    { name, &__emu_invoker<&__VA_ARGS__>::call, __emu_invoker<&__VA_ARGS__>::count,       \
      __emu_invoker<&__VA_ARGS__>::sizes, __emu_invoker<&__VA_ARGS__>::kinds }

// The interface between emulated kernels (cuda_emu.h, compiled into each module) and the
// emulator runtime (runtime.cpp, one shared library loaded once per process).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <utility>

enum {
    EMU_BAR_SYNC = 0, EMU_BAR_COUNT = 1, EMU_BAR_AND = 2, EMU_BAR_OR = 3,
};
enum {
    EMU_WARP_SHFL_IDX = 1, EMU_WARP_SHFL_UP, EMU_WARP_SHFL_DOWN, EMU_WARP_SHFL_XOR,
    EMU_WARP_BALLOT, EMU_WARP_SYNC, EMU_WARP_LDMATRIX, EMU_WARP_MMA,
};
enum {
    EMU_PARAM_POINTER = 1, EMU_PARAM_INT, EMU_PARAM_UINT, EMU_PARAM_FLOAT, EMU_PARAM_BOOL,
    EMU_PARAM_OTHER,
};
// Element types of mma.sync operands.
enum { EMU_MMA_F16 = 1, EMU_MMA_BF16 = 2 };

struct __emu_dim3 { unsigned x, y, z; };

// One launchable kernel instance of a module: its name expression, an invoker that unpacks
// CUDA-style kernel arguments (an array of pointers to the values), and its parameters.
struct __emu_entry {
    const char* name;
    void (*invoke)(void**);
    int nparams;
    const int* sizes;
    const int* kinds;
};

extern "C" {
extern void* __emu_cur;  // the running CUDA thread (its first member is threadIdx)
extern __emu_dim3 __emu_block_idx, __emu_block_dim, __emu_grid_dim;
extern int __emu_atomic_depth;  // > 0 inside an atomic: exempt from the shared race check

int __emu_barrier(int kind, int pred);
[[noreturn]] void __emu_trap(void);
void __emu_warp_op(int kind, unsigned mask, const void* in, void* out, size_t bytes, int a,
                   int width);
unsigned __emu_lane_mask(void);
void* __emu_shared_static(size_t size, size_t align, int site);
void* __emu_shared_dynamic(void);
size_t __emu_cvta_shared(const void* p);
unsigned __emu_is_shared(const void* p);

// Emulated PTX instructions (ptx.py maps each instruction text to one of these).
void __emu_ptx_cp_async(uint32_t dst, uint64_t src, int cp_size, int src_size, int level);
void __emu_ptx_cp_async_commit_group(void);
void __emu_ptx_cp_async_wait_group(int n);
void __emu_ptx_cp_async_wait_all(void);
// `site` numbers the asm statement: the lanes of a warp must all be at the same one.
void __emu_ptx_ldmatrix(uint32_t* out, int num, int trans, uint32_t addr, int site);
void __emu_ptx_mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b, const float* c,
                            int ab_type, int site);
}

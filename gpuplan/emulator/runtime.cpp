// Emulator runtime: runs one kernel launch on the host, every CUDA thread a fiber.
//
// - Blocks run one after another in a permuted order; the threads of a block are fibers on
//   the launching OS thread. A fiber runs until it blocks (barrier, warp collective) or
//   exits; the next fiber comes from a seeded random warp-priority schedule (see
//   make_runnable), so a missing barrier or a race shows up as a wrong result.
// - __syncthreads completes when every thread of the block has arrived or exited.
// - Warp collectives (shuffles, votes, ldmatrix, mma.sync) execute when every existing
//   lane of the warp has arrived at the same kind of collective with the full mask; a
//   partial mask, a mismatch or a lane that never arrives aborts the launch with a message.
// - cp.async copies are queued per thread and land in shared memory only at the
//   cp.async.wait_group that covers their group.
// - Shared memory (static and dynamic) is filled with garbage at every block start.
// - Kernel modules are compiled with -fsanitize=address in "callback" mode and no ASan
//   runtime: every load and store of the kernel calls __asan_load<N>/__asan_store<N>
//   defined here, which abort the launch unless the bytes lie inside the arrays passed to
//   the kernel, the thread's own stack, the block's shared memory or the module's data.
// - Shared-memory race check (GPUPLAN_EMULATOR_RACECHECK=0 turns it off): two accesses to a
//   byte, at least one a store, by different threads in the same block interval (between
//   barrier releases) fault unless they are lanes of one warp with a warp collective between
//   them. ldmatrix rows count as reads of the lanes giving them, a cp.async destination as
//   written at issue, and accesses inside atomics are exempt.
//
// Faults never kill the process: the launch stops and emu_launch returns the message.
#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>
#include <string>
#include <vector>

#include "emu_abi.h"

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kMaxThreads = 1024;
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kStaticSharedBytes = 48 * 1024;
constexpr size_t kDynSharedWindow = 64 * 1024;  // shared window offset of dynamic memory
constexpr int kMaxSites = 4096;

enum State { RUNNABLE, AT_BARRIER, AT_WARP, EXITED, FAULTED };

struct AsyncCopy {
    unsigned char* dst;
    const unsigned char* src;
    int cp_size, src_size;
    long group;  // -1: not committed yet
};

struct Thread {
    __emu_dim3 tid;  // first: cuda_emu.h reads threadIdx here
    int linear, lane, warp;
    State state;
    void* sp;
    unsigned char* stack_lo;
    unsigned char* stack_hi;
    int barrier_result;
    long next_group;
    std::vector<AsyncCopy> pending;
};

struct Warp {
    int nlanes;
    unsigned lane_mask;
    int arrived;
    int kind, a, width;
    unsigned mask;
    size_t bytes;
    int first_lane;
    int site;               // the asm statement of an emulated PTX collective (0: none)
    int first_warp_thread;  // linear id of lane 0
    int lane_a[32];  // per-lane operand: the source lane or delta of a shuffle
    uint32_t in[32][12];
    uint32_t out[32][8];
};

struct Region {
    uintptr_t lo, hi;
    int arg;  // argument index, -1 for module data and runtime state
};

// Race check of shared memory, one record per byte: the last writer and the warps that read
// it, stamped with the block interval (between two barrier releases) they happened in.
struct Shadow {
    uint32_t wstamp, rstamp;  // interval stamps of the last write / of the reads in rwarps
    uint32_t rwarps;          // warps that read the byte in interval rstamp
    uint16_t writer, reader;  // thread ids (linear) of the last writer / last reader
    uint32_t wwep, rwep;      // their warp's collective count at the access
};

struct Launch {
    const __emu_entry* entry = nullptr;
    void** args = nullptr;
    bool active = false;
    bool faulted = false;
    std::string error;
    unsigned nthreads = 0;
    std::vector<Thread> threads;
    std::vector<Warp> warps;
    std::vector<std::vector<int>> runnable;  // per warp: its runnable threads
    std::vector<int> warp_order;             // warp priorities, highest first
    unsigned exited = 0, at_barrier = 0;
    int bar_count = 0, bar_and = 1, bar_or = 0;
    void* sched_sp = nullptr;
    uint64_t rng = 0;
    std::vector<Region> regions;  // argument arrays
    std::vector<Region> statics;  // module and runtime data
    unsigned char* static_smem = nullptr;
    size_t static_used = 0;
    long site_offset[kMaxSites];
    unsigned char* dyn_smem = nullptr;
    size_t dyn_bytes = 0;
    bool racecheck = true;
    uint32_t stamp = 0;                 // the block interval: bumped at block start, barriers
    std::vector<uint32_t> warp_epoch;   // collectives completed per warp
    std::vector<Shadow> shadow;         // static window bytes, then dynamic ones
};

Launch g;
unsigned char* g_stacks = nullptr;  // kMaxThreads stacks with a guard page under each
unsigned char g_static_smem[kStaticSharedBytes] __attribute__((aligned(128)));
std::vector<unsigned char> g_dyn_buffer;

uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void fill_garbage(unsigned char* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = splitmix(g.rng);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; ++i) p[i] = static_cast<unsigned char>(splitmix(g.rng));
}

template <typename T> void shuffle(T* v, size_t n) {
    for (size_t i = n; i > 1; --i) std::swap(v[i - 1], v[splitmix(g.rng) % i]);
}

Thread* current() { return static_cast<Thread*>(__emu_cur); }

// -- context switching ---------------------------------------------------------------------
#if defined(__x86_64__)
// emu_switch(save, to): push the callee-saved registers and the SSE/x87 control words on the
// current stack, store the stack pointer in *save, continue on stack `to`.
extern "C" void emu_switch(void** save, void* to);
asm(R"(
    .text
    .p2align 4
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

void fiber_main();

void* initial_stack(Thread& t) {
    uint64_t* sp = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(t.stack_hi) & ~15ULL);
    *--sp = 0;                                            // fiber_main's return address
    *--sp = reinterpret_cast<uint64_t>(&fiber_main);      // where emu_switch returns to
    for (int i = 0; i < 6; ++i) *--sp = 0;                // rbp rbx r12 r13 r14 r15
    uint32_t ctl[2];
    asm volatile("stmxcsr %0" : "=m"(ctl[0]));
    asm volatile("fnstcw %0" : "=m"(ctl[1]));
    uint64_t word;
    memcpy(&word, ctl, 8);
    *--sp = word;
    return sp;
}
#else
#error "the emulator's fiber switch is written for x86-64"
#endif

void to_scheduler(Thread* t) { emu_switch(&t->sp, g.sched_sp); }

int next_runnable();

// A blocked or finished fiber hands the OS thread straight to the next runnable one (half
// the context switches of going through the scheduler); with none, to the scheduler.
void yield_fiber(Thread* t) {
    const int i = next_runnable();
    if (i < 0) {
        to_scheduler(t);
        return;
    }
    Thread* n = &g.threads[i];
    __emu_cur = n;
    emu_switch(&t->sp, n->sp);
}

std::string where(const Thread* t) {
    char buf[256];
    snprintf(buf, sizeof buf, "kernel %s, block (%u,%u,%u)", g.entry ? g.entry->name : "?",
             __emu_block_idx.x, __emu_block_idx.y, __emu_block_idx.z);
    std::string s = buf;
    if (t) {
        snprintf(buf, sizeof buf, ", thread (%u,%u,%u) (warp %d lane %d)", t->tid.x, t->tid.y,
                 t->tid.z, t->warp, t->lane);
        s += buf;
    }
    return s;
}

// Record a fault; inside a fiber, abandon it (the launch stops). Never returns to a kernel.
[[noreturn]] void fault_in_fiber(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void fault_in_fiber(const char* fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    Thread* t = current();
    if (!g.faulted) {
        g.faulted = true;
        g.error = where(t) + ": " + msg;
    }
    if (t == nullptr) abort();  // only called from fibers
    t->state = FAULTED;
    to_scheduler(t);
    __builtin_unreachable();
}

void fault_here(const std::string& msg) {
    if (!g.faulted) {
        g.faulted = true;
        g.error = where(nullptr) + ": " + msg;
    }
}

void fiber_main() {
    Thread* t = current();
    g.entry->invoke(g.args);
    t->pending.clear();  // copies never waited for are dropped with the thread
    t->state = EXITED;
    ++g.exited;
    yield_fiber(t);
    __builtin_unreachable();
}

// -- memory checks -------------------------------------------------------------------------
bool inside(const std::vector<Region>& rs, uintptr_t a, size_t n) {
    for (const Region& r : rs)
        if (a >= r.lo && a + n <= r.hi) return true;
    return false;
}

bool in_shared(uintptr_t a, size_t n) {
    uintptr_t s = reinterpret_cast<uintptr_t>(g.static_smem);
    if (a >= s && a + n <= s + g.static_used) return true;
    uintptr_t d = reinterpret_cast<uintptr_t>(g.dyn_smem);
    return g.dyn_bytes && a >= d && a + n <= d + g.dyn_bytes;
}

std::string nearest_argument(uintptr_t a, size_t n) {
    const Region* best = nullptr;
    uintptr_t best_d = ~uintptr_t(0);
    for (const Region& r : g.regions) {
        uintptr_t d = a < r.lo ? r.lo - a : (a + n > r.hi ? a + n - r.hi : 0);
        if (d < best_d) best_d = d, best = &r;
    }
    if (!best) return "the kernel was given no arrays";
    char buf[200];
    if (a < best->lo) {
        snprintf(buf, sizeof buf, "%lu bytes before argument %d (an array of %lu bytes)",
                 static_cast<unsigned long>(best->lo - a), best->arg,
                 static_cast<unsigned long>(best->hi - best->lo));
    } else {
        snprintf(buf, sizeof buf,
                 "%lu bytes past the end of argument %d (an array of %lu bytes)",
                 static_cast<unsigned long>(a + n - best->hi), best->arg,
                 static_cast<unsigned long>(best->hi - best->lo));
    }
    return buf;
}

const Thread& thread_at(int linear) { return g.threads[linear]; }

[[noreturn]] void report_race(const char* what, uint32_t off, const Thread& other,
                              const char* other_did) {
    fault_in_fiber("shared-memory race: %s at shared offset %#x while thread (%u,%u,%u) "
                   "(warp %d lane %d) %s it since the last __syncthreads and no __syncwarp or "
                   "warp collective orders them (a missing barrier?)",
                   what, off, other.tid.x, other.tid.y, other.tid.z, other.warp, other.lane,
                   other_did);
}

// Two accesses in the same block interval conflict unless they come from the same thread,
// or from one warp with a warp collective between them.
inline bool unordered(int a, uint32_t a_wep, const Thread& b) {
    if (a == b.linear) return false;
    return thread_at(a).warp != b.warp || a_wep == g.warp_epoch[b.warp];
}

void race_access(const Thread& t, uint32_t off, size_t n, bool store) {
    Shadow* s = g.shadow.data() + (off >= kDynSharedWindow ? off - kDynSharedWindow +
                                   kStaticSharedBytes : off);
    const uint32_t wep = g.warp_epoch[t.warp], bit = 1u << (t.warp & 31);
    for (size_t i = 0; i < n; ++i, ++s) {
        if (s->wstamp == g.stamp && unordered(s->writer, s->wwep, t))
            report_race(store ? "a store overwrites a byte" : "a load reads a byte",
                        static_cast<uint32_t>(off + i), thread_at(s->writer), "wrote");
        if (store) {
            if (s->rstamp == g.stamp && ((s->rwarps & ~bit) ||
                                         unordered(s->reader, s->rwep, t)))
                report_race("a store overwrites a byte", static_cast<uint32_t>(off + i),
                            thread_at(s->reader), "read");
            s->wstamp = g.stamp, s->writer = static_cast<uint16_t>(t.linear), s->wwep = wep;
        } else {
            if (s->rstamp != g.stamp) s->rstamp = g.stamp, s->rwarps = 0;
            s->rwarps |= bit;
            s->reader = static_cast<uint16_t>(t.linear), s->rwep = wep;
        }
    }
}

uint32_t shared_offset(uintptr_t a) {
    const uintptr_t s = reinterpret_cast<uintptr_t>(g.static_smem);
    if (a >= s && a < s + kStaticSharedBytes) return static_cast<uint32_t>(a - s);
    return static_cast<uint32_t>(kDynSharedWindow + (a - reinterpret_cast<uintptr_t>(g.dyn_smem)));
}

}  // namespace

__attribute__((visibility("default"))) int __emu_atomic_depth = 0;

namespace {

inline void check_access(uintptr_t a, size_t n, bool store) {
    if (!g.active) return;
    Thread* t = current();
    if (t && a >= reinterpret_cast<uintptr_t>(t->stack_lo) &&
        a + n <= reinterpret_cast<uintptr_t>(t->stack_hi))
        return;
    if (in_shared(a, n)) {
        if (t && g.racecheck && !__emu_atomic_depth) race_access(*t, shared_offset(a), n, store);
        return;
    }
    if (inside(g.regions, a, n) || inside(g.statics, a, n)) return;
    if (t == nullptr) return;
    std::string near = nearest_argument(a, n);
    fault_in_fiber("out-of-bounds %s of %zu bytes at %#lx: outside every array passed to the "
                   "kernel, the thread's stack and shared memory (nearest: %s)",
                   store ? "store" : "load", n, static_cast<unsigned long>(a), near.c_str());
}

// -- block scheduling ----------------------------------------------------------------------
// Scheduling: warps have random priorities (redrawn at every barrier release, and a warp
// drops to a random rank with probability 1/8 when it completes a collective); the next
// fiber is a random runnable thread of the highest-priority warp that has one. So one warp
// may run far ahead of another between barriers (as on a GPU), which exposes missing
// barriers and write-after-read races across warp collectives.
void make_runnable(Thread& t) {
    t.state = RUNNABLE;
    g.runnable[t.warp].push_back(t.linear);
}

int next_runnable() {
    for (int w : g.warp_order) {
        std::vector<int>& q = g.runnable[w];
        if (q.empty()) continue;
        const size_t i = splitmix(g.rng) % q.size();
        const int t = q[i];
        q[i] = q.back();
        q.pop_back();
        return t;
    }
    return -1;
}

void reprioritize(int warp) {
    std::vector<int>& o = g.warp_order;
    o.erase(std::find(o.begin(), o.end(), warp));
    o.insert(o.begin() + static_cast<long>(splitmix(g.rng) % (o.size() + 1)), warp);
}

void release_barrier() {
    std::vector<int> waiting;
    for (unsigned i = 0; i < g.nthreads; ++i)  // threads past the block's are stale
        if (g.threads[i].state == AT_BARRIER) waiting.push_back(static_cast<int>(i));
    int result = 0;
    // the kind of the first waiter decides (every thread of a correct kernel uses the same)
    for (int i : waiting) {
        Thread& t = g.threads[i];
        switch (t.barrier_result) {
            case EMU_BAR_COUNT: result = g.bar_count; break;
            case EMU_BAR_AND: result = g.bar_and; break;
            case EMU_BAR_OR: result = g.bar_or; break;
            default: result = 0;
        }
        t.barrier_result = result;
        make_runnable(t);
    }
    g.at_barrier = 0;
    g.bar_count = 0, g.bar_and = 1, g.bar_or = 0;
    ++g.stamp;  // a new interval: accesses before the barrier are ordered before those after
    shuffle(g.warp_order.data(), g.warp_order.size());
}

const char* warp_op_name(int kind) {
    switch (kind) {
        case EMU_WARP_SHFL_IDX: return "__shfl_sync";
        case EMU_WARP_SHFL_UP: return "__shfl_up_sync";
        case EMU_WARP_SHFL_DOWN: return "__shfl_down_sync";
        case EMU_WARP_SHFL_XOR: return "__shfl_xor_sync";
        case EMU_WARP_BALLOT: return "__ballot_sync";
        case EMU_WARP_SYNC: return "__syncwarp";
        case EMU_WARP_LDMATRIX: return "ldmatrix.sync";
        case EMU_WARP_MMA: return "mma.sync";
    }
    return "warp collective";
}

std::string lane_list(const Warp& w, int warp, State s) {
    std::string out;
    for (int l = 0; l < w.nlanes; ++l) {
        const Thread& t = g.threads[warp * 32 + l];
        if (t.state == s) out += (out.empty() ? "" : ",") + std::to_string(l);
    }
    return out.empty() ? "none" : out;
}

// Nothing can run: either the block is done, or a barrier can open, or it is stuck.
bool resolve_stall() {
    if (g.exited == g.nthreads) return false;
    if (g.at_barrier > 0 && g.at_barrier + g.exited == g.nthreads) {
        release_barrier();
        return true;
    }
    for (size_t wi = 0; wi < g.warps.size(); ++wi) {
        const Warp& w = g.warps[wi];
        if (w.arrived == 0) continue;
        fault_here(std::string(warp_op_name(w.kind)) + " in warp " + std::to_string(wi) +
                   " cannot complete: lanes " + lane_list(w, static_cast<int>(wi), AT_WARP) +
                   " arrived, lanes exited: " + lane_list(w, static_cast<int>(wi), EXITED) +
                   ", lanes waiting at __syncthreads: " +
                   lane_list(w, static_cast<int>(wi), AT_BARRIER) +
                   " (every lane of the warp must execute it)");
        return false;
    }
    fault_here("deadlock: " + std::to_string(g.at_barrier) + " threads wait at __syncthreads, " +
               std::to_string(g.exited) + " exited, of " + std::to_string(g.nthreads));
    return false;
}

void run_block() {
    const unsigned bx = __emu_block_dim.x, by = __emu_block_dim.y;
    g.exited = g.at_barrier = 0;
    g.bar_count = 0, g.bar_and = 1, g.bar_or = 0;
    ++g.stamp;
    g.warp_epoch.assign(g.warps.size(), 0);
    g.runnable.resize(g.warps.size());
    for (auto& q : g.runnable) q.clear();
    g.warp_order.resize(g.warps.size());
    for (size_t w = 0; w < g.warps.size(); ++w) g.warp_order[w] = static_cast<int>(w);
    shuffle(g.warp_order.data(), g.warp_order.size());
    for (unsigned i = 0; i < g.nthreads; ++i) {
        Thread& t = g.threads[i];
        t.tid = {i % bx, (i / bx) % by, i / (bx * by)};
        t.linear = static_cast<int>(i);
        t.lane = static_cast<int>(i % 32);
        t.warp = static_cast<int>(i / 32);
        t.stack_hi = g_stacks + (i + 1) * (kStackBytes + 4096);
        t.stack_lo = t.stack_hi - kStackBytes;
        t.sp = initial_stack(t);
        t.barrier_result = 0;
        t.next_group = 0;
        t.pending.clear();
        make_runnable(t);
    }
    for (Warp& w : g.warps) w.arrived = 0;
    fill_garbage(g.static_smem, g.static_used);
    if (g.dyn_bytes) fill_garbage(g.dyn_smem, g.dyn_bytes);
    for (;;) {
        for (int i = next_runnable(); i >= 0; i = next_runnable()) {
            Thread& t = g.threads[i];
            __emu_cur = &t;
            emu_switch(&g.sched_sp, t.sp);
            __emu_cur = nullptr;
            if (g.faulted) return;
        }
        if (!resolve_stall()) return;
    }
}

// A shared-memory byte address of the emulated shared window (see __emu_cvta_shared).
unsigned char* shared_ptr(uint32_t addr, size_t n, const char* what) {
    if (addr + n <= g.static_used) return g.static_smem + addr;
    if (addr >= kDynSharedWindow && addr - kDynSharedWindow + n <= g.dyn_bytes)
        return g.dyn_smem + (addr - kDynSharedWindow);
    fault_in_fiber("%s: shared address %#x (%zu bytes) is outside the block's shared memory "
                   "(static %zu bytes at 0, dynamic %zu bytes at %#zx)",
                   what, addr, n, g.static_used, g.dyn_bytes, kDynSharedWindow);
}

// -- warp collectives ----------------------------------------------------------------------
void execute_warp(Warp& w);

}  // namespace

__attribute__((visibility("default"))) void* __emu_cur = nullptr;
__attribute__((visibility("default"))) __emu_dim3 __emu_block_idx, __emu_block_dim, __emu_grid_dim;

EMU_EXPORT int __emu_barrier(int kind, int pred) {
    Thread* t = current();
    if (!t) return 0;
    t->state = AT_BARRIER;
    t->barrier_result = kind;
    g.bar_count += pred;
    g.bar_and &= pred;
    g.bar_or |= pred;
    ++g.at_barrier;
    yield_fiber(t);
    return t->barrier_result;
}

EMU_EXPORT void __emu_trap(void) {
    fault_in_fiber("the kernel executed __trap()");
}

EMU_EXPORT unsigned __emu_lane_mask(void) {
    Thread* t = current();
    return t ? g.warps[t->warp].lane_mask : 0u;
}

namespace {

// One lane arrives at a warp collective with `in_bytes` of operands; it leaves with
// `out_bytes` of results once every lane of the warp has arrived and the op has executed.
void warp_collective(int kind, unsigned mask, const void* in, size_t in_bytes, void* out,
                     size_t out_bytes, int a, int width, int site = 0) {
    Thread* t = current();
    const size_t bytes = in_bytes;
    Warp& w = g.warps[t->warp];
    if (mask != w.lane_mask) {
        fault_in_fiber("%s with mask %#x: the emulator requires the full mask of the warp's "
                       "existing lanes (%#x); partial masks are not supported",
                       warp_op_name(kind), mask, w.lane_mask);
    }
    const bool shuffle_op = kind == EMU_WARP_SHFL_IDX || kind == EMU_WARP_SHFL_UP ||
                            kind == EMU_WARP_SHFL_DOWN || kind == EMU_WARP_SHFL_XOR;
    if (w.arrived == 0) {
        w.kind = kind, w.a = a, w.width = width, w.bytes = bytes, w.mask = mask;
        w.first_lane = t->lane, w.site = site;
    } else if (w.kind != kind || w.bytes != bytes || w.width != width || w.site != site ||
               (!shuffle_op && w.a != a)) {  // a shuffle's source lane may differ per lane
        fault_in_fiber("lane %d executes %s while lane %d of the same warp waits in %s "
                       "(operands differ, or the lanes are at different instructions)",
                       t->lane, warp_op_name(kind), w.first_lane, warp_op_name(w.kind));
    }
    if (kind == EMU_WARP_SHFL_IDX || kind == EMU_WARP_SHFL_UP || kind == EMU_WARP_SHFL_DOWN ||
        kind == EMU_WARP_SHFL_XOR) {
        if (width < 1 || width > 32 || (width & (width - 1))) {
            fault_in_fiber("%s: width %d is not a power of two in [1, 32]", warp_op_name(kind),
                           width);
        }
    }
    memcpy(w.in[t->lane], in, bytes);
    w.lane_a[t->lane] = a;
    t->state = AT_WARP;
    if (++w.arrived == w.nlanes) {
        execute_warp(w);
        ++g.warp_epoch[t->warp];  // accesses before it are ordered before those after it
        w.arrived = 0;
        int lanes[32], n = 0;
        for (int l = 0; l < w.nlanes; ++l)
            if (l != t->lane) lanes[n++] = t->warp * 32 + l;
        for (int i = 0; i < n; ++i) make_runnable(g.threads[lanes[i]]);
        t->state = RUNNABLE;
        if (splitmix(g.rng) % 8 == 0) reprioritize(t->warp);
    } else {
        yield_fiber(t);
    }
    memcpy(out, w.out[t->lane], out_bytes);
}

}  // namespace

EMU_EXPORT void __emu_warp_op(int kind, unsigned mask, const void* in, void* out, size_t bytes,
                              int a, int width) {
    warp_collective(kind, mask, in, bytes, out, bytes, a, width);
}

namespace {

float f16_to_float(uint16_t bits) {  // IEEE binary16 -> binary32, exactly
    const uint32_t sign = (bits & 0x8000u) << 16, exp = (bits >> 10) & 0x1f, man = bits & 0x3ffu;
    uint32_t f;
    if (exp == 0x1f) {
        f = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        const float v = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24
        memcpy(&f, &v, 4);
        f |= sign;
    } else {
        f = sign | ((exp + 112) << 23) | (man << 13);
    }
    float v;
    memcpy(&v, &f, 4);
    return v;
}

// binary16 bit patterns to float, all 65536 of them (built once).
const float* f16_table() {
    static float* table = [] {
        float* t = new float[65536];
        for (uint32_t b = 0; b < 65536; ++b) t[b] = f16_to_float(static_cast<uint16_t>(b));
        return t;
    }();
    return table;
}

double decode_16(uint32_t reg, int hi, int type, const float* f16) {
    const uint16_t bits = static_cast<uint16_t>(hi ? reg >> 16 : reg);
    if (type == EMU_MMA_BF16) {
        const uint32_t f = static_cast<uint32_t>(bits) << 16;
        float v;
        memcpy(&v, &f, 4);
        return v;
    }
    return f16[bits];
}

// D = A * B + C for one m16n8k16 tile, operands gathered from the lanes' fragments by the
// PTX ISA's layout tables (groupID = lane >> 2, threadID_in_group = lane % 4).
void execute_mma(Warp& w) {
    const int type = w.a;
    const float* f16 = f16_table();
    double A[16][16], B[16][8], D[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const int g4 = lane >> 2, tig = lane & 3;
        const uint32_t* in = w.in[lane];
        for (int i = 0; i < 8; ++i) {  // A element i: register i / 2, low half first
            const int row = g4 + ((i & 2) ? 8 : 0);
            const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = decode_16(in[i / 2], i & 1, type, f16);
        }
        for (int i = 0; i < 4; ++i) {  // B element i: register 4 + i / 2
            const int k = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0);
            B[k][g4] = decode_16(in[4 + i / 2], i & 1, type, f16);
        }
    }
    // Products of 16-bit floats are exact in double; each output sums its 16 products in
    // ascending k in double (independent accumulators across columns), then adds C and
    // rounds once to f32.
    for (int r = 0; r < 16; ++r) {
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int k = 0; k < 16; ++k)
            for (int c = 0; c < 8; ++c) acc[c] += A[r][k] * B[k][c];
        for (int c = 0; c < 8; ++c) D[r][c] = acc[c];
    }
    for (int lane = 0; lane < 32; ++lane) {
        const int g4 = lane >> 2, tig = lane & 3;
        for (int i = 0; i < 4; ++i) {
            const int row = g4 + (i >= 2 ? 8 : 0), col = tig * 2 + (i & 1);
            float c;
            memcpy(&c, &w.in[lane][6 + i], 4);
            const float d = static_cast<float>(D[row][col] + c);
            memcpy(&w.out[lane][i], &d, 4);
        }
    }
}

void execute_ldmatrix(Warp& w) {
    const int num = w.a >> 1, trans = w.a & 1;
    uint16_t rows[4][8][8];
    for (int j = 0; j < num; ++j) {
        for (int r = 0; r < 8; ++r) {
            const int lane = 8 * j + r;
            const uint32_t addr = w.in[lane][0];
            if (addr % 16) {
                fault_in_fiber("ldmatrix: the row address %#x given by lane %d (row %d of "
                               "matrix %d) is not 16-byte aligned", addr, lane, r, j);
            }
            memcpy(rows[j][r], shared_ptr(addr, 16, "ldmatrix"), 16);
            if (g.racecheck) race_access(g.threads[w.first_warp_thread + lane], addr, 16, false);
        }
    }
    for (int lane = 0; lane < 32; ++lane) {
        const int r = lane >> 2, c = 2 * (lane & 3);
        for (int j = 0; j < num; ++j) {
            const uint16_t lo = trans ? rows[j][c][r] : rows[j][r][c];
            const uint16_t hi = trans ? rows[j][c + 1][r] : rows[j][r][c + 1];
            w.out[lane][j] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
        }
    }
}

void execute_warp(Warp& w) {
    const int n = w.nlanes;
    switch (w.kind) {
        case EMU_WARP_SHFL_IDX:
        case EMU_WARP_SHFL_UP:
        case EMU_WARP_SHFL_DOWN:
        case EMU_WARP_SHFL_XOR:
            for (int l = 0; l < n; ++l) {
                const int seg = l & ~(w.width - 1), end = seg + w.width, a = w.lane_a[l];
                int src = l;
                if (w.kind == EMU_WARP_SHFL_IDX) src = seg + (a & (w.width - 1));
                if (w.kind == EMU_WARP_SHFL_UP) src = l - a >= seg ? l - a : l;
                if (w.kind == EMU_WARP_SHFL_DOWN) src = l + a < end ? l + a : l;
                if (w.kind == EMU_WARP_SHFL_XOR) src = ((l ^ a) & ~(w.width - 1)) == seg
                                                           ? (l ^ a) : l;
                if (src >= n) src = l;  // lanes past the block's last thread do not exist
                memcpy(w.out[l], w.in[src], w.bytes);
            }
            break;
        case EMU_WARP_BALLOT: {
            uint32_t bits = 0;
            for (int l = 0; l < n; ++l)
                if (w.in[l][0]) bits |= 1u << l;
            for (int l = 0; l < n; ++l) w.out[l][0] = bits;
            break;
        }
        case EMU_WARP_SYNC:
            for (int l = 0; l < n; ++l) w.out[l][0] = 0;
            break;
        case EMU_WARP_LDMATRIX:
            execute_ldmatrix(w);
            break;
        case EMU_WARP_MMA:
            execute_mma(w);
            break;
    }
}

}  // namespace

// -- emulated PTX: warp-wide ----------------------------------------------------------------
EMU_EXPORT void __emu_ptx_ldmatrix(uint32_t* out, int num, int trans, uint32_t addr,
                                   int site) {
    Thread* t = current();
    if (g.warps[t->warp].nlanes != 32)
        fault_in_fiber("ldmatrix.sync.aligned needs a full warp of 32 threads");
    if (num != 1 && num != 2 && num != 4) fault_in_fiber("ldmatrix: .x%d is not .x1/.x2/.x4", num);
    uint32_t r[4];
    warp_collective(EMU_WARP_LDMATRIX, 0xffffffffu, &addr, sizeof addr, r, sizeof(uint32_t) * num,
                    num * 2 + (trans ? 1 : 0), 32, site);
    for (int j = 0; j < num; ++j) out[j] = r[j];
}

EMU_EXPORT void __emu_ptx_mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b,
                                       const float* c, int ab_type, int site) {
    Thread* t = current();
    if (g.warps[t->warp].nlanes != 32)
        fault_in_fiber("mma.sync.aligned needs a full warp of 32 threads");
    uint32_t in[10];
    memcpy(in, a, 16);
    memcpy(in + 4, b, 8);
    memcpy(in + 6, c, 16);
    warp_collective(EMU_WARP_MMA, 0xffffffffu, in, 40, d, 16, ab_type, 32, site);
}

// -- emulated PTX: cp.async -----------------------------------------------------------------
EMU_EXPORT void __emu_ptx_cp_async(uint32_t dst, uint64_t src, int cp_size, int src_size,
                                   int level) {
    (void)level;
    Thread* t = current();
    if (cp_size != 4 && cp_size != 8 && cp_size != 16)
        fault_in_fiber("cp.async: cp-size %d is not 4, 8 or 16", cp_size);
    if (src_size < 0 || src_size > cp_size)
        fault_in_fiber("cp.async: src-size %d is outside [0, %d]", src_size, cp_size);
    if (dst % cp_size || src % cp_size)
        fault_in_fiber("cp.async: addresses must be aligned to %d bytes (shared %#x, global "
                       "%#lx)", cp_size, dst, static_cast<unsigned long>(src));
    unsigned char* d = shared_ptr(dst, cp_size, "cp.async destination");
    if (src_size > 0) check_access(src, src_size, false);
    // the copy may land any time after its issue: its bytes count as written now
    if (g.racecheck) race_access(*t, dst, cp_size, true);
    t->pending.push_back({d, reinterpret_cast<const unsigned char*>(src), cp_size, src_size,
                          -1});
}

EMU_EXPORT void __emu_ptx_cp_async_commit_group(void) {
    Thread* t = current();
    for (AsyncCopy& c : t->pending)
        if (c.group < 0) c.group = t->next_group;
    ++t->next_group;  // an empty group counts too
}

EMU_EXPORT void __emu_ptx_cp_async_wait_group(int n) {
    Thread* t = current();
    const long limit = t->next_group - n;  // groups [0, limit) must be complete
    std::vector<AsyncCopy> keep;
    for (AsyncCopy& c : t->pending) {
        if (c.group >= 0 && c.group < limit) {
            if (c.src_size) memcpy(c.dst, c.src, c.src_size);
            memset(c.dst + c.src_size, 0, c.cp_size - c.src_size);
        } else {
            keep.push_back(c);
        }
    }
    t->pending.swap(keep);
}

EMU_EXPORT void __emu_ptx_cp_async_wait_all(void) {
    __emu_ptx_cp_async_commit_group();
    __emu_ptx_cp_async_wait_group(0);
}

// -- shared memory ---------------------------------------------------------------------------
EMU_EXPORT void* __emu_shared_static(size_t size, size_t align, int site) {
    if (site < 0 || site >= kMaxSites) fault_in_fiber("too many __shared__ declarations");
    long off = g.site_offset[site];
    if (off < 0) {
        if (align < 16) align = 16;
        size_t start = (g.static_used + align - 1) & ~(align - 1);
        if (start + size > kStaticSharedBytes)
            fault_in_fiber("static shared memory of the launch exceeds %zu bytes",
                           kStaticSharedBytes);
        fill_garbage(g_static_smem + g.static_used, start + size - g.static_used);
        g.static_used = start + size;
        g.site_offset[site] = off = static_cast<long>(start);
    }
    return g.static_smem + off;
}

EMU_EXPORT void* __emu_shared_dynamic(void) { return g.dyn_smem; }

EMU_EXPORT size_t __emu_cvta_shared(const void* p) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    uintptr_t s = reinterpret_cast<uintptr_t>(g.static_smem);
    uintptr_t d = reinterpret_cast<uintptr_t>(g.dyn_smem);
    if (a >= s && a <= s + g.static_used) return a - s;
    if (g.dyn_smem && a >= d && a <= d + g.dyn_bytes) return kDynSharedWindow + (a - d);
    fault_in_fiber("__cvta_generic_to_shared(%p): not a shared-memory address", p);
}

EMU_EXPORT unsigned __emu_is_shared(const void* p) {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    return in_shared(a, 1) ? 1u : 0u;
}

// -- the bounds checks GCC's -fsanitize=address calls (callback mode, no ASan runtime) ------
#define EMU_ASAN_SIZE(n)                                                                     \
    EMU_EXPORT void __asan_load##n(uintptr_t a) { check_access(a, n, false); }               \
    EMU_EXPORT void __asan_store##n(uintptr_t a) { check_access(a, n, true); }               \
    EMU_EXPORT void __asan_load##n##_noabort(uintptr_t a) { check_access(a, n, false); }     \
    EMU_EXPORT void __asan_store##n##_noabort(uintptr_t a) { check_access(a, n, true); }
EMU_ASAN_SIZE(1)
EMU_ASAN_SIZE(2)
EMU_ASAN_SIZE(4)
EMU_ASAN_SIZE(8)
EMU_ASAN_SIZE(16)
EMU_EXPORT void __asan_loadN(uintptr_t a, size_t n) { check_access(a, n, false); }
EMU_EXPORT void __asan_storeN(uintptr_t a, size_t n) { check_access(a, n, true); }
EMU_EXPORT void __asan_loadN_noabort(uintptr_t a, size_t n) { check_access(a, n, false); }
EMU_EXPORT void __asan_storeN_noabort(uintptr_t a, size_t n) { check_access(a, n, true); }
EMU_EXPORT void* __asan_memcpy(void* d, const void* s, size_t n) {
    check_access(reinterpret_cast<uintptr_t>(s), n, false);
    check_access(reinterpret_cast<uintptr_t>(d), n, true);
    return memcpy(d, s, n);
}
EMU_EXPORT void* __asan_memmove(void* d, const void* s, size_t n) {
    check_access(reinterpret_cast<uintptr_t>(s), n, false);
    check_access(reinterpret_cast<uintptr_t>(d), n, true);
    return memmove(d, s, n);
}
EMU_EXPORT void* __asan_memset(void* d, int c, size_t n) {
    check_access(reinterpret_cast<uintptr_t>(d), n, true);
    return memset(d, c, n);
}
// -- alignment: GCC's -fsanitize=alignment calls this when a typed access is misaligned --
// A GPU faults on a load or store whose address is not a multiple of its type's alignment
// ("misaligned address": a float4 or a 16-byte pack read through a cast pointer, a double at
// 4 bytes); x86 reads it silently and the compiler may split it into smaller accesses. Each
// typed access of the kernel is checked against its C++ type's alignment, which for CUDA's
// types (vector types, __align__ structs) is the GPU's. The layouts are UBSan's (v1 ABI).
struct UbsanLocation {
    const char* file;
    uint32_t line;
    uint32_t column;
};
struct UbsanType {
    uint16_t kind;
    uint16_t info;
    char name[1];
};
struct UbsanTypeMismatch {
    UbsanLocation loc;
    const UbsanType* type;
    unsigned char log_alignment;
    unsigned char check_kind;
};

// A load or a store; anything else (a reference bound to a struct that is then copied, a
// member access) reads or writes through the misaligned pointer as well.
static const char* ubsan_access(unsigned char kind) {
    return kind == 0 ? "load of" : kind == 1 ? "store to" : "access to";
}

static void misaligned(const UbsanTypeMismatch* d, uintptr_t a) {
    const uintptr_t align = uintptr_t(1) << d->log_alignment;
    if (!g.active || a == 0 || (a & (align - 1)) == 0 || current() == nullptr) return;
    const char* file = d->loc.file ? d->loc.file : "?";
    const char* base = strrchr(file, '/');
    fault_in_fiber("misaligned address: %s %#lx of type %s, which needs %lu-byte alignment "
                   "on a GPU (%s:%u)", ubsan_access(d->check_kind), static_cast<unsigned long>(a),
                   d->type ? d->type->name : "?", static_cast<unsigned long>(align),
                   base ? base + 1 : file, d->loc.line);
}

EMU_EXPORT void __ubsan_handle_type_mismatch_v1(UbsanTypeMismatch* d, uintptr_t a) {
    misaligned(d, a);
}
EMU_EXPORT void __ubsan_handle_type_mismatch_v1_abort(UbsanTypeMismatch* d, uintptr_t a) {
    misaligned(d, a);
}

EMU_EXPORT void __asan_init(void) {}
EMU_EXPORT void __asan_version_mismatch_check_v8(void) {}
EMU_EXPORT void __asan_handle_no_return(void) {}
EMU_EXPORT void __asan_before_dynamic_init(const char*) {}
EMU_EXPORT void __asan_after_dynamic_init(void) {}
EMU_EXPORT void __asan_register_globals(void*, size_t) {}
EMU_EXPORT void __asan_unregister_globals(void*, size_t) {}

// -- launch ----------------------------------------------------------------------------------
namespace {

int add_object_segments(struct dl_phdr_info* info, size_t, void* data) {
    const uintptr_t probe = reinterpret_cast<uintptr_t>(data);
    bool mine = false;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_LOAD) continue;
        uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
        if (probe >= lo && probe < lo + ph.p_memsz) mine = true;
    }
    if (!mine) return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_LOAD) continue;
        uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
        g.statics.push_back({lo, lo + ph.p_memsz, -1});
    }
    return 1;
}

bool ensure_stacks() {
    if (g_stacks) return true;
    const size_t per = kStackBytes + 4096;
    void* p = mmap(nullptr, per * kMaxThreads + 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    g_stacks = static_cast<unsigned char*>(p);
    for (int i = 0; i < kMaxThreads; ++i)  // a guard page under every stack
        mprotect(g_stacks + i * per, 4096, PROT_NONE);
    return true;
}

}  // namespace

// Runs `entry` over grid x block. args: CUDA-style pointers to each parameter's value.
// regions: 2*nregions words (base, bytes) of the arrays the kernel may touch, in argument
// order, and region_args their argument numbers (-1: reached through a pointer table).
// Returns 0; 1 for a fault during the run, 2 for a launch the driver would refuse (message
// in err).
EMU_EXPORT int emu_launch(const __emu_entry* entry, const unsigned* grid,
                          const unsigned* block, size_t dyn_bytes, void** args,
                          const uint64_t* regions, const int* region_args, int nregions,
                          uint64_t seed, char* err, size_t errlen) {
    g.entry = entry;
    g.faulted = false;
    g.error.clear();
    g.args = args;
    g.rng = seed;
    __emu_cur = nullptr;
    __emu_grid_dim = {grid[0], grid[1], grid[2]};
    __emu_block_dim = {block[0], block[1], block[2]};
    __emu_block_idx = {0, 0, 0};
    const unsigned long long nthreads =
        static_cast<unsigned long long>(block[0]) * block[1] * block[2];
    std::string bad;
    if (block[0] == 0 || block[1] == 0 || block[2] == 0 || nthreads > kMaxThreads ||
        block[2] > 64)
        bad = "block (" + std::to_string(block[0]) + "," + std::to_string(block[1]) + "," +
              std::to_string(block[2]) + ") is not a valid block: each extent >= 1, z <= 64, "
              "at most 1024 threads";
    else if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || grid[1] > 65535 ||
             grid[2] > 65535 || grid[0] > 2147483647u)
        bad = "grid (" + std::to_string(grid[0]) + "," + std::to_string(grid[1]) + "," +
              std::to_string(grid[2]) + ") is not a valid grid";
    else if (!ensure_stacks())
        bad = "cannot map fiber stacks";
    if (!bad.empty()) {
        snprintf(err, errlen, "kernel %s: invalid launch: %s", entry->name, bad.c_str());
        return 2;
    }
    g.nthreads = static_cast<unsigned>(nthreads);
    if (g.threads.size() < kMaxThreads) g.threads.resize(kMaxThreads);
    g.warps.assign((g.nthreads + 31) / 32, Warp{});
    for (size_t w = 0; w < g.warps.size(); ++w) {
        const unsigned n = std::min<unsigned>(32, g.nthreads - 32 * w);
        g.warps[w].nlanes = static_cast<int>(n);
        g.warps[w].first_warp_thread = static_cast<int>(32 * w);
        g.warps[w].lane_mask = n == 32 ? 0xffffffffu : ((1u << n) - 1u);
    }
    g.regions.clear();
    for (int i = 0; i < nregions; ++i)
        g.regions.push_back({regions[2 * i], regions[2 * i] + regions[2 * i + 1], region_args[i]});
    static const void* statics_for = nullptr;  // the data segments of the module and runtime
    if (statics_for != reinterpret_cast<const void*>(entry->invoke)) {
        g.statics.clear();
        dl_iterate_phdr(add_object_segments, reinterpret_cast<void*>(entry->invoke));
        dl_iterate_phdr(add_object_segments, reinterpret_cast<void*>(&g));
        g.statics.push_back({reinterpret_cast<uintptr_t>(g.threads.data()),
                             reinterpret_cast<uintptr_t>(g.threads.data() + g.threads.size()),
                             -1});
        statics_for = reinterpret_cast<const void*>(entry->invoke);
    }
    g.static_smem = g_static_smem;
    g.static_used = 0;
    std::fill(g.site_offset, g.site_offset + kMaxSites, -1L);
    if (g_dyn_buffer.size() < dyn_bytes) g_dyn_buffer.resize(dyn_bytes);
    const char* rc = getenv("GPUPLAN_EMULATOR_RACECHECK");
    g.racecheck = !(rc && rc[0] == '0');
    if (g.racecheck && g.shadow.size() < kStaticSharedBytes + dyn_bytes)
        g.shadow.resize(kStaticSharedBytes + dyn_bytes, Shadow{0, 0, 0, 0, 0, 0, 0});
    g.dyn_bytes = dyn_bytes;
    g.dyn_smem = dyn_bytes ? g_dyn_buffer.data() : nullptr;

    // Blocks in a permuted order: i -> (a * i + c) mod total with a coprime to total.
    const unsigned long long total =
        static_cast<unsigned long long>(grid[0]) * grid[1] * grid[2];
    unsigned long long mul = 1, add = 0;
    if (total > 1) {
        add = splitmix(g.rng) % total;
        for (int tries = 0; tries < 64; ++tries) {
            unsigned long long cand = splitmix(g.rng) % total;
            unsigned long long x = cand, y = total;
            while (y) { unsigned long long r = x % y; x = y; y = r; }
            if (cand > 0 && x == 1) { mul = cand; break; }
        }
    }
    g.active = true;
    for (unsigned long long i = 0; i < total && !g.faulted; ++i) {
        const unsigned long long b =
            static_cast<unsigned long long>((static_cast<unsigned __int128>(mul) * i + add) %
                                            total);
        __emu_block_idx = {static_cast<unsigned>(b % grid[0]),
                           static_cast<unsigned>((b / grid[0]) % grid[1]),
                           static_cast<unsigned>(b / (static_cast<unsigned long long>(grid[0]) *
                                                      grid[1]))};
        run_block();
    }
    g.active = false;
    __emu_cur = nullptr;
    fflush(stdout);  // a kernel's printf shows up when its launch returns, as after a sync
    if (g.faulted) {
        snprintf(err, errlen, "%s (GPUPLAN_EMULATOR_SEED schedule seed %#llx)", g.error.c_str(),
                 static_cast<unsigned long long>(seed));
        return 1;
    }
    return 0;
}

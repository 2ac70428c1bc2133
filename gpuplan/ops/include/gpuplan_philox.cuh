// Counter-based Philox4x32-10 (Salmon et al., SC'11; the generator of Random123 and cuRAND)
// and the dropout keep rule built on it, shared by the dropout kernels (dropout.cu) and the
// fused attention kernels (attention*.cu). gpuplan/ops/dropout/plans.py reproduces the bits on the
// host. Element i of a flat array under (seed, offset):
//   key     = (lo32(seed), hi32(seed))
//   counter = (lo32(j), hi32(j), 0, 0) with j = offset + i / 4 (mod 2^64)
//   word    = philox4x32_10(counter, key)[i % 4]
//   u       = float(word >> 8) * 2^-24          (exact: a 24-bit integer times a power of 2)
//   keep    = u >= float32(p)
#pragma once
#include "gpuplan_common.cuh"

namespace gp {

struct Philox4 {
    unsigned int v[4];
};

__device__ __forceinline__ Philox4 philox4x32_10(unsigned long long j, unsigned long long seed) {
    const unsigned int M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    const unsigned int W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    unsigned int c0 = static_cast<unsigned int>(j), c1 = static_cast<unsigned int>(j >> 32);
    unsigned int c2 = 0u, c3 = 0u;
    unsigned int k0 = static_cast<unsigned int>(seed), k1 = static_cast<unsigned int>(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += W0;
            k1 += W1;
        }
        const unsigned int hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
        const unsigned int hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
        const unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    Philox4 out;
    out.v[0] = c0;
    out.v[1] = c1;
    out.v[2] = c2;
    out.v[3] = c3;
    return out;
}

__device__ __forceinline__ bool keep_element(unsigned int word, float p) {
    return static_cast<float>(word >> 8) * 0x1p-24f >= p;
}

// Word `l` (0..3) of r, selected without indexing the array (which would put it in local
// memory).
__device__ __forceinline__ unsigned int philox_word(const Philox4& r, unsigned int l) {
    return (l & 2u) ? ((l & 1u) ? r.v[3] : r.v[2]) : ((l & 1u) ? r.v[1] : r.v[0]);
}

// Keep bits of elements i and i + 1 (one generator call when both share a counter, i.e.
// i % 4 != 3; two otherwise). The fused attention kernels hold their scores in such pairs.
__device__ __forceinline__ void keep_pair(unsigned long long i, unsigned long long seed,
                                          unsigned long long offset, float p, bool& k0,
                                          bool& k1) {
    const unsigned int l = static_cast<unsigned int>(i & 3u);
    const Philox4 r = philox4x32_10(offset + i / 4, seed);
    k0 = keep_element(philox_word(r, l), p);
    if (l != 3u) {
        k1 = keep_element(philox_word(r, l + 1u), p);
    } else {
        k1 = keep_element(philox4x32_10(offset + i / 4 + 1, seed).v[0], p);
    }
}

// Keep bit of element i.
__device__ __forceinline__ bool keep_one(unsigned long long i, unsigned long long seed,
                                         unsigned long long offset, float p) {
    return keep_element(philox_word(philox4x32_10(offset + i / 4, seed),
                                    static_cast<unsigned int>(i & 3u)), p);
}

// The dropout entry of batch entry b of a batch that holds `group` of every `stride` entries
// of the full tensor's, from entry `shift` on: (b / group) * stride + shift + b % group. A
// tensor-parallel shard's [outer, heads] attention batch is so laid in the [outer,
// total_heads] batch of one process (group = heads, stride = total_heads, shift = its first
// head), and draws that process's bits; (1, 1, 0) is the identity.
__device__ __forceinline__ long long drop_entry(long long b, long long group, long long stride,
                                                long long shift) {
    return (b / group) * stride + shift + b % group;
}

}  // namespace gp

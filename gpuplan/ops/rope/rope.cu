// Rotary position embedding, rotate-half convention (Hugging Face's Llama): for the element
// (b, t, h, i) of a [batch, seq, heads, dim] problem, position p = offset + t and column
// i < half = dim / 2, with angle = p * theta^(-2 i / dim):
//   y[i]        = x[i] cos(angle) - x[i + half] sin(angle)
//   y[i + half] = x[i + half] cos(angle) + x[i] sin(angle)
// INVERSE rotates by -angle (the gradient: the rotation's transpose). x and y are addressed
// by element strides of b, t and h (the dim axis is contiguous), so the output may be laid
// out otherwise than the input: [batch, heads, seq, dim] from [batch, seq, heads, dim]
// (heads split out for attention in the same pass), or back for the gradient.
//
// One thread per (t, i) pair of the x grid dimension (grid-stride) computes cos and sin once,
// in double whatever T (the angle reaches thousands of radians: a float angle would lose
// ~1e-4 there), and rotates that pair in every (batch, head) row of its y grid slice. The
// rotation itself runs in gp::Acc<T> (float for halves, double for double).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "gpuplan_map.cuh"

template <typename T, bool INVERSE>
__global__ void rope_rotate(const T* __restrict__ x, T* __restrict__ y, long long rows,
                            long long seq, long long heads, long long dim, long long offset,
                            double theta, long long xb, long long xt, long long xh,
                            long long yb, long long yt, long long yh) {
    using A = gp::Acc<T>;
    const long long half = dim / 2;
    const long long pairs = seq * half;
    for (long long p = gp::thread_index(); p < pairs; p += gp::grid_stride()) {
        const long long t = p / half, i = p - t * half;
        const double angle = static_cast<double>(offset + t)
                             * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
        const A c = static_cast<A>(cos(angle));
        const A s = static_cast<A>(INVERSE ? -sin(angle) : sin(angle));
        for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
            const long long b = r / heads, h = r - b * heads;
            const long long xi = b * xb + t * xt + h * xh + i, yi = b * yb + t * yt + h * yh + i;
            const A x1 = gp::ld(x[xi]), x2 = gp::ld(x[xi + half]);
            y[yi] = gp::st<T>(x1 * c - x2 * s);
            y[yi + half] = gp::st<T>(x2 * c + x1 * s);
        }
    }
}

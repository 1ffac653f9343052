// Ladder step 4: 16-byte vectors.
//
// A float4 load moves 16 bytes in one instruction, four times what a float load
// moves. For half-split pairs a thread loads chunk c of the first half (pairs
// 4c..4c+3, their x) and the matching chunk c of the second half (the same
// pairs' y): the pairs stay inside one thread, no data is exchanged between
// threads, and the warp still reads contiguous runs. Four times fewer threads,
// loads, stores and index computations for the same bytes.
//
// It needs every chunk aligned to 16 bytes: cudaMalloc returns 256-byte aligned
// memory, and head_dim % 8 == 0 keeps every row and half-row start aligned.
#include "ladder.cuh"

namespace ladder {
namespace {

__global__ void vector16(const Problem p) {
    const int64_t chunks = p.head_dim / 8;  // 16-byte chunks per half row.
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= total_rows(p) * chunks) return;
    const Row r = row_at(p, t / chunks);
    const int64_t chunk = t % chunks;
    const int64_t position = position_of(p, r.token);
    float c[4], s[4];
    for (int j = 0; j < 4; ++j) angle_cos_sin(p, position, 4 * chunk + j, c[j], s[j]);
    const float4* in = reinterpret_cast<const float4*>(r.in);
    float4* out = reinterpret_cast<float4*>(r.out);
    float4 x = in[chunk], y = in[chunks + chunk];  // Pairs 4c..4c+3: their x, then their y.
    rotate4(x, y, c, s);
    out[chunk] = x;
    out[chunks + chunk] = y;
}

}  // namespace

void launch_v4(const Problem& p, const Grid& grid) {
    vector16<<<unsigned(grid.blocks), grid.threads_per_block>>>(p);
    check_launch("v4 vector16");
}

}  // namespace ladder

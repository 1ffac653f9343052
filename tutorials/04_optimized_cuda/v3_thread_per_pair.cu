// Ladder step 3: one thread per pair, coalesced.
//
// Thread t takes pair i = t % (head_dim/2) of row t / (head_dim/2): it loads
// feature i and feature i + head_dim/2, rotates, stores both. Each pair is now
// loaded, computed and stored once, and the accesses stay coalesced: the warp's
// 32 threads read 32 consecutive floats of the first half, then 32 consecutive
// floats of the second half. This is the mapping of the library's cuda-naive
// (cuda/naive_backend.cu), which adds strides, dtypes and partial rotary.
#include "ladder.cuh"

namespace ladder {
namespace {

__global__ void thread_per_pair(const Problem p) {
    const int64_t half = p.head_dim / 2;
    const int64_t pair = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (pair >= total_rows(p) * half) return;
    const Row r = row_at(p, pair / half);
    const int64_t i = pair % half;
    float c, s;
    angle_cos_sin(p, position_of(p, r.token), i, c, s);
    float x = r.in[i], y = r.in[i + half];
    rope::rotate_pair(x, y, c, s);
    r.out[i] = x;
    r.out[i + half] = y;
}

}  // namespace

//! [launch and check]
void launch_v3(const Problem& p, const Grid& grid) {
    thread_per_pair<<<unsigned(grid.blocks), grid.threads_per_block>>>(p);
    check_launch("v3 thread_per_pair");
}
//! [launch and check]

}  // namespace ladder

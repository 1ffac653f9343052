// Ladder step 1: one thread per head row, the CPU loop moved onto the GPU.
//
// Each thread takes one head row and runs chapter 1's pair loop over it. It is
// the first port most people write, and it is slow for a reason worth seeing
// once: at every step of the loop, the 32 threads of a warp read feature i of
// 32 *different* rows, head_dim * 4 = 512 bytes apart. Each of those reads
// touches its own 32-byte memory sector and uses 4 bytes of it (uncoalesced),
// and the sectors are evicted before the next step of the loop could use the
// rest. There are also few threads: one per row instead of one per pair.
#include "ladder.cuh"

namespace ladder {
namespace {

__global__ void thread_per_row(const Problem p) {
    const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (row >= total_rows(p)) return;
    const Row r = row_at(p, row);
    const int64_t position = position_of(p, r.token);
    const int64_t half = p.head_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
        float c, s;
        angle_cos_sin(p, position, i, c, s);
        float x = r.in[i], y = r.in[i + half];
        rope::rotate_pair(x, y, c, s);
        r.out[i] = x;
        r.out[i + half] = y;
    }
}

}  // namespace

void launch_v1(const Problem& p, const Grid& grid) {
    thread_per_row<<<unsigned(grid.blocks), grid.threads_per_block>>>(p);
    check_launch("v1 thread_per_row");
}

}  // namespace ladder

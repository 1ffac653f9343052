// Ladder step 2: one thread per element.
//
// Turn the mapping around: thread t takes feature d = t % head_dim of row
// t / head_dim, so neighbouring threads touch neighbouring features and every
// warp-wide load is coalesced. But a feature's new value needs its partner
// (x' = x cos - y sin needs y), so each thread loads both features of its pair
// and computes the pair's angle and sincosf: every pair is loaded and computed
// twice, once by each of its two threads, and half of the result is thrown away.
//
// It also cannot run in place: the thread for x could overwrite x before the
// thread for y has read it. That is why every version here writes to q_out/k_out.
#include "ladder.cuh"

namespace ladder {
namespace {

__global__ void thread_per_element(const Problem p) {
    const int64_t element = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (element >= total_rows(p) * p.head_dim) return;
    const Row r = row_at(p, element / p.head_dim);
    const int64_t d = element % p.head_dim, half = p.head_dim / 2;
    const int64_t i = d < half ? d : d - half;  // The pair this feature belongs to.
    float c, s;
    angle_cos_sin(p, position_of(p, r.token), i, c, s);
    float x = r.in[i], y = r.in[i + half];
    rope::rotate_pair(x, y, c, s);
    r.out[d] = d < half ? x : y;  // Keep only this thread's half of the pair.
}

}  // namespace

void launch_v2(const Problem& p, const Grid& grid) {
    thread_per_element<<<unsigned(grid.blocks), grid.threads_per_block>>>(p);
    check_launch("v2 thread_per_element");
}

}  // namespace ladder

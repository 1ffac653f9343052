// Ladder step 5: cos/sin once per token, reused by every head of q and k.
//
// Versions 1 to 4 compute the same angles again for every head: with 32 query
// and 8 key heads, 40 times the sincosf that is needed. Here a thread owns one
// 16-byte chunk (4 pairs) of one token: it computes those 4 cos/sin once and
// then walks the token's head rows, q's heads then k's, rotating the same chunk
// of each.
//
// A thread that loops must not wait for memory once per head: a load takes
// about a microsecond to come back. So it issues the loads of kRowsInFlight
// rows before it uses the first, and those loads are issued before the
// sincosf, whose arithmetic then runs while the bytes are on their way.
//
// The kernel takes heads_per_thread from its Grid: v5 gives each thread all of
// its token's heads (maximum reuse); v6 (v6_grid_for_device.cu) splits them.
#include "ladder.cuh"

namespace ladder {
namespace {

constexpr int kRowsInFlight = 4;

__global__ void cos_sin_per_token(const Problem p, const int64_t heads_per_thread) {
    const int64_t chunks = p.head_dim / 8;
    const int64_t heads = p.q_heads + p.k_heads;
    const int64_t groups = (heads + heads_per_thread - 1) / heads_per_thread;
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= p.tokens * groups * chunks) return;
    const int64_t chunk = t % chunks;  // Fastest: neighbouring threads, neighbouring chunks of a row.
    const int64_t group = (t / chunks) % groups;
    const int64_t token = t / chunks / groups;
    const int64_t first_head = group * heads_per_thread;
    const int64_t end_head = first_head + heads_per_thread < heads ? first_head + heads_per_thread : heads;

    bool have_cos_sin = false;
    float c[4], s[4];
    for (int64_t head = first_head; head < end_head; head += kRowsInFlight) {
        // Loads of up to kRowsInFlight rows first...
        float4 x[kRowsInFlight], y[kRowsInFlight];
#pragma unroll
        for (int k = 0; k < kRowsInFlight; ++k) {
            if (head + k >= end_head) continue;
            const float4* in = reinterpret_cast<const float4*>(head_of_token(p, token, head + k).in);
            x[k] = in[chunk];
            y[k] = in[chunks + chunk];
        }
        // ...then, once per thread, the trigonometry (while those loads are in flight)...
        if (!have_cos_sin) {
            const int64_t position = position_of(p, token);
            for (int j = 0; j < 4; ++j) angle_cos_sin(p, position, 4 * chunk + j, c[j], s[j]);
            have_cos_sin = true;
        }
        // ...then the rotations and stores.
#pragma unroll
        for (int k = 0; k < kRowsInFlight; ++k) {
            if (head + k >= end_head) continue;
            float4* out = reinterpret_cast<float4*>(head_of_token(p, token, head + k).out);
            rotate4(x[k], y[k], c, s);
            out[chunk] = x[k];
            out[chunks + chunk] = y[k];
        }
    }
}

}  // namespace

void launch_cos_sin_per_token(const Problem& p, const Grid& grid) {
    cos_sin_per_token<<<unsigned(grid.blocks), grid.threads_per_block>>>(p, grid.heads_per_thread);
    check_launch("v5/v6 cos_sin_per_token");
}

}  // namespace ladder

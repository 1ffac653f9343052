// HF's DeepSeek order (Style::interleaved_to_half, and its reverse half_to_interleaved) on the GPU, shared by cuda-naive and
// cuda-optimized: a kernel of its own, so that neither backend's kernels for the other
// styles change. See to_half.hpp.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "check.hpp"
#include "kernel_args.cuh"
#include "rope/detail/pair_step.hpp"
#include "rope/rotation.hpp"
#include "to_half.hpp"

namespace rope::cuda_detail {
namespace {

/// Everything the kernel needs, passed by value (see kernel_args.cuh for why).
struct ToHalfArgs {
    Operand operands[2];       // [0] = q, [1] = k (k may have no heads).
    PositionSource positions;  // Device-resident ids or cu_seqlens, or an offset.
    AngleArgs<kMaxPairs> angles;
    Style style;     // interleaved_to_half or half_to_interleaved.
    int64_t seq;
    int64_t rotary_dim;
    int64_t pairs;
    int64_t head_dim;
    int64_t q_rows;  // Head rows of q; k's rows come after them.
    int64_t rows;    // Head rows of q and k.
};

// One block per head row (a grid-stride loop over rows). Its threads rotate the row's
// pairs into shared memory, already in HF's order; the barrier then guarantees that
// every input feature of the window has been read before any of it is overwritten.
template <typename Storage>
__global__ void rope_to_half_kernel(const __grid_constant__ ToHalfArgs args) {
    extern __shared__ float rotated[];  // rotary_dim floats: the row's window, rotated.
    for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
        const int which = row < args.q_rows ? 0 : 1;
        const Operand& operand = args.operands[which];
        const Geometry& g = operand.in_geometry;
        const Geometry& o = operand.out_geometry;
        int64_t rest = which == 0 ? row : row - args.q_rows;  // -> (b, h, s), s fastest.
        const int64_t s = rest % args.seq;
        rest /= args.seq;
        const int64_t h = rest % g.heads;
        const int64_t b = rest / g.heads;
        const auto* in = static_cast<const Storage*>(operand.in);
        auto* out = static_cast<Storage*>(operand.out);
        for (int64_t i = threadIdx.x; i < args.pairs; i += blockDim.x) {
            const int64_t position = args.positions.at(b, s, args.angles.pair_axis[i]);
            float cos_angle, sin_angle;
            rotation_factors(args.angles, position, i, cos_angle, sin_angle);
            const PairIndex pair = pair_elements(args.style, args.rotary_dim, i);
            float x = to_float(in[g.offset(b, h, s, pair.first)]);
            float y = to_float(in[g.offset(b, h, s, pair.second)]);
            rotate_pair(x, y, cos_angle, sin_angle);
            const PairIndex to = output_pair_elements(args.style, args.rotary_dim, i);
            rotated[to.first] = x;
            rotated[to.second] = y;
        }
        __syncthreads();  // The whole window is read: now it may be written.
        for (int64_t d = threadIdx.x; d < args.rotary_dim; d += blockDim.x)
            out[o.offset(b, h, s, d)] = from_float<Storage>(rotated[d]);
        if (operand.in != operand.out)  // Partial rotary: the rest passes through.
            for (int64_t d = args.rotary_dim + threadIdx.x; d < args.head_dim; d += blockDim.x)
                out[o.offset(b, h, s, d)] = in[g.offset(b, h, s, d)];
        __syncthreads();  // `rotated` is the next row's.
    }
}

}  // namespace

void launch_to_half(const Plan& plan) {
    ToHalfArgs args{};
    args.operands[0] = plan.q;
    args.operands[1] = plan.k;
    args.positions = plan.positions;
    args.angles = make_angle_args<kMaxPairs>(plan);
    args.style = plan.style;
    args.seq = plan.seq;
    args.rotary_dim = plan.rotary_dim;
    args.pairs = plan.pairs;
    args.head_dim = plan.head_dim;
    const int64_t rows_per_head = plan.batch * plan.seq;
    args.q_rows = plan.q.in_geometry.heads * rows_per_head;
    args.rows = args.q_rows + plan.k.in_geometry.heads * rows_per_head;
    if (args.rows == 0) return;
    // A warp per 32 pairs, up to 256 threads: no thread idles at DeepSeek's 32 pairs.
    const int threads = int(std::clamp<int64_t>((plan.pairs + 31) / 32 * 32, 32, 256));
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(args.rows, INT_MAX));  // The loop covers the rest.
    const size_t shared = size_t(plan.rotary_dim) * sizeof(float);
    dispatch_dtype(plan.dtype, [&](auto storage) {
        using Storage = decltype(storage);
        launch_kernel("rope_to_half_kernel", launch_config(grid, threads, stream_of(plan), shared),
                      rope_to_half_kernel<Storage>, args);
    });
}

}  // namespace rope::cuda_detail

// cuda-optimized's fused QK-RMSNorm + RoPE: one warp per norm group (a head row, or all
// heads of a token for across_heads).
//
// - The sum of squares: the 32 lanes are PyTorch's 8 lanes x 4 vector accumulators
//   (qk_norm_sum_of_squares), so lane l sums features (4i + l/8) * 8 + l%8: at each step
//   the warp reads 32 consecutive features, one coalesced access. Three shuffles give
//   lanes 0-7 their lane sums, eight more broadcast them, added in PyTorch's order: the
//   same float32 as cpu-naive's sum, bit for bit.
// - The norm and the rotation: lane l takes pairs l, l + 32, ... of each head row of the
//   group (half-split: features i and i + rotary_dim/2, consecutive across the warp;
//   interleaved: 2i and 2i + 1), computes cos/sin once per pair and head, and writes the
//   pair it read, so an in-place call needs no further synchronisation.
// One warp per head (not per token) keeps a decode step's few tokens spread over many warps.
#include <climits>
#include <cstdint>

#include "../qk_norm_common.cuh"

namespace rope {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;
static_assert(detail::kTorchLanes * detail::kTorchVectors == kWarp, "a lane per partial sum");

template <typename Storage>
__global__ void qk_norm_warp_kernel(const __grid_constant__ cuda_detail::QkNormArgsDevice args) {
    const int lane = int(threadIdx.x) % kWarp;
    const int64_t warps_per_block = blockDim.x / kWarp;
    const int64_t step = int64_t(gridDim.x) * warps_per_block;
    // item is the same in every lane of a warp: the shuffles below see all 32 lanes.
    for (int64_t item = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / kWarp; item < args.total_items;
         item += step) {
        const cuda_detail::QkNormItem at = cuda_detail::qk_norm_item(args, item);
        const QkNormStep& norm = args.step;
        const NormOperand& operand = norm.operands[at.which];
        const Geometry& g = operand.tensor.in_geometry;
        const auto* in = static_cast<const Storage*>(operand.tensor.in);
        const bool across = norm.kind == QkNormKind::across_heads;
        const int64_t first_head = across ? 0 : at.group, n = detail::group_features(norm, operand);
        const int64_t head_dim = norm.head_dim;
        const auto load = [&](int64_t f) {
            return to_float(in[g.offset(at.b, first_head + f / head_dim, at.s, f % head_dim)]);
        };
        const float partial =
            detail::torch_partial_sum(n, lane / detail::kTorchLanes, lane % detail::kTorchLanes, load);
        float lane_sum = partial;  // lanes 0-7: vector 0's, then vectors 1, 2, 3 added in order
        for (int vector = 1; vector < detail::kTorchVectors; ++vector)
            lane_sum = detail::add_rn(lane_sum, __shfl_down_sync(kFullMask, partial, vector * detail::kTorchLanes));
        float total = detail::torch_tail_sum(n, load);
        for (int l = 0; l < detail::kTorchLanes; ++l) total = detail::add_rn(total, __shfl_sync(kFullMask, lane_sum, l));
        const float inverse = detail::inverse_rms(total, n, norm.eps);

        const TokenPositions positions = token_positions(args.positions, norm.axes, at.b, at.s);
        const int64_t last_head = across ? g.heads : at.group + 1;
        for (int64_t h = first_head; h < last_head; ++h)
            detail::normalize_rotate_head<Storage>(norm, args.angles, positions, operand, at.b, h, at.s, inverse, lane,
                                                   kWarp);
    }
}

}  // namespace

void detail::run_qk_norm_cuda_optimized(const QkNormPlan& plan) {
    cuda_detail::check_qk_norm_pointers(plan);
    dispatch_dtype(plan.rope.dtype, [&](auto storage) {
        using Storage = decltype(storage);
        if (!plan.rope.empty()) {
            const cuda_detail::QkNormArgsDevice args = cuda_detail::make_qk_norm_args(plan);
            if (args.total_items > 0) {
                constexpr int threads = 128;  // four warps, four groups per block
                const int64_t warps_per_block = threads / kWarp;
                const int64_t blocks = (args.total_items + warps_per_block - 1) / warps_per_block;
                cuda_detail::launch_kernel(
                    "qk_norm_warp_kernel",
                    cuda_detail::launch_config(unsigned(blocks < INT_MAX ? blocks : INT_MAX), threads,
                                               cuda_detail::stream_of(plan.rope)),
                    qk_norm_warp_kernel<Storage>, args);
            }
        }
        cuda_detail::copy_v<Storage>(plan);
    });
}

}  // namespace rope

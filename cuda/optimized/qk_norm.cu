// cuda-optimized's fused QK-RMSNorm + RoPE: one warp per norm group (a head row, or all
// heads of a token for across_heads).
//
// - The sum of squares: the 32 lanes are PyTorch's 8 lanes x 4 vector accumulators
//   (qk_norm_sum_of_squares), so lane l sums features (4i + l/8) * 8 + l%8: at each step
//   the warp reads 32 consecutive features, one coalesced access. Three shuffles give
//   lanes 0-7 their lane sums, eight more broadcast them, added in PyTorch's order: the
//   same float32 as cpu-naive's sum, bit for bit. (16-byte loads would give each lane 8
//   or 4 consecutive features, not the ones its partial sum adds in that order: keeping
//   the order would cost a shuffle per feature, so the loads stay element-wise.)
// - The norm and the rotation: lane l takes pairs l, l + 32, ... of each head row of the
//   group (half-split: features i and i + rotary_dim/2, consecutive across the warp;
//   interleaved: 2i and 2i + 1), and writes the pair it read, so an in-place call needs no
//   further synchronisation.
// - cos and sin (per-head kinds): a block holds the groups of one token (up to kTokenWarps
//   of its q and k heads, a token's heads split over several blocks where it has more), and
//   its threads compute the token's cos and sin once, into shared memory, for all of those
//   heads: the accurate sincosf is the kernel's costliest arithmetic, and every head of a
//   token turns by the same angles. The values are those rotation_factors gives each pair,
//   so the results do not change. across_heads (one group per token, every head of it in one
//   warp) computes them per pair and head, as before.
// One warp per head (not per token) keeps a decode step's few tokens spread over many warps.
#include <climits>
#include <cstdint>

#include "../qk_norm_common.cuh"

namespace rope {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;
constexpr int kTokenWarps = 8;  // Groups (warps) per block of the per-head kernel.
static_assert(detail::kTorchLanes * detail::kTorchVectors == kWarp, "a lane per partial sum");

// inverse_rms of the group of head first_head (all heads from 0 for across_heads) of token (b, s),
// the sum added in PyTorch's order (see the top of the file); the same value in every lane.
template <typename Storage>
__device__ float warp_group_inverse_rms(const QkNormStep& norm, const NormOperand& operand, int64_t b,
                                        int64_t first_head, int64_t s, int lane) {
    const Geometry& g = operand.tensor.in_geometry;
    const auto* in = static_cast<const Storage*>(operand.tensor.in);
    const int64_t n = detail::group_features(norm, operand), head_dim = norm.head_dim;
    const auto load = [&](int64_t f) { return to_float(in[g.offset(b, first_head + f / head_dim, s, f % head_dim)]); };
    const float partial = detail::torch_partial_sum(n, lane / detail::kTorchLanes, lane % detail::kTorchLanes, load);
    float lane_sum = partial;  // lanes 0-7: vector 0's, then vectors 1, 2, 3 added in order
    for (int vector = 1; vector < detail::kTorchVectors; ++vector)
        lane_sum = detail::add_rn(lane_sum, __shfl_down_sync(kFullMask, partial, vector * detail::kTorchLanes));
    float total = detail::torch_tail_sum(n, load);
    for (int l = 0; l < detail::kTorchLanes; ++l) total = detail::add_rn(total, __shfl_sync(kFullMask, lane_sum, l));
    return detail::inverse_rms(total, n, norm.eps);
}

// across_heads: warp w of the grid takes group w (grid-stride), every head of it.
template <typename Storage>
__global__ void qk_norm_warp_kernel(const __grid_constant__ cuda_detail::QkNormArgsDevice args) {
    const int lane = int(threadIdx.x) % kWarp;
    const int64_t warps_per_block = blockDim.x / kWarp;
    const int64_t step = int64_t(gridDim.x) * warps_per_block;
    // item is the same in every lane of a warp: the shuffles see all 32 lanes.
    for (int64_t item = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / kWarp; item < args.total_items;
         item += step) {
        const cuda_detail::QkNormItem at = cuda_detail::qk_norm_item(args, item);
        const QkNormStep& norm = args.step;
        const NormOperand& operand = norm.operands[at.which];
        const bool across = norm.kind == QkNormKind::across_heads;
        const int64_t first_head = across ? 0 : at.group;
        const float inverse = warp_group_inverse_rms<Storage>(norm, operand, at.b, first_head, at.s, lane);
        const TokenPositions positions = token_positions(args.positions, norm.axes, at.b, at.s);
        const int64_t last_head = across ? operand.tensor.in_geometry.heads : at.group + 1;
        for (int64_t h = first_head; h < last_head; ++h)
            detail::normalize_rotate_head<Storage>(norm, args.angles, positions, operand, at.b, h, at.s, inverse, lane,
                                                   kWarp);
    }
}

// Per-head kinds: block work item w is token w / chunks, its groups [chunk * kTokenWarps, ...) with
// chunk = w % chunks (q's heads, then k's); warp i of the block takes the chunk's group i. The loop
// bound depends on the block alone, so every thread reaches both barriers.
template <typename Storage>
__global__ void qk_norm_token_kernel(const __grid_constant__ cuda_detail::QkNormArgsDevice args, int64_t tokens,
                                     int64_t chunks) {
    __shared__ float cos_of[cuda_detail::kMaxPairs], sin_of[cuda_detail::kMaxPairs];
    const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
    const QkNormStep& norm = args.step;
    const int64_t q_groups = args.groups[0], groups = args.groups[0] + args.groups[1];
    for (int64_t work = blockIdx.x; work < tokens * chunks; work += gridDim.x) {
        const int64_t token = work / chunks, b = token / args.seq, s = token % args.seq;
        __syncthreads();  // The previous work item's readers are done with cos_of and sin_of.
        if (int64_t(threadIdx.x) < norm.pairs) {
            const TokenPositions positions = token_positions(args.positions, norm.axes, b, s);
            for (int64_t i = threadIdx.x; i < norm.pairs; i += blockDim.x)
                rotation_factors(args.angles, positions.of_pair(args.angles, norm.axes, i), i, cos_of[i], sin_of[i]);
        }
        __syncthreads();
        const int64_t group = work % chunks * kTokenWarps + warp;
        if (group >= groups) continue;  // The whole warp: group is the same in its lanes.
        const int which = group < q_groups ? 0 : 1;
        const int64_t h = which == 0 ? group : group - q_groups;
        const NormOperand& operand = norm.operands[which];
        const float inverse = warp_group_inverse_rms<Storage>(norm, operand, b, h, s, lane);
        const auto factors = [&](int64_t i, float& cos_angle, float& sin_angle) {
            cos_angle = cos_of[i];
            sin_angle = sin_of[i];
        };
        detail::normalize_rotate_head_with<Storage>(norm, factors, operand, b, h, s, inverse, lane, kWarp);
    }
}

}  // namespace

void detail::run_qk_norm_cuda_optimized(const QkNormPlan& plan) {
    cuda_detail::check_qk_norm_pointers(plan);
    dispatch_dtype(plan.rope.dtype, [&](auto storage) {
        using Storage = decltype(storage);
        if (!plan.rope.empty()) {
            const cuda_detail::QkNormArgsDevice args = cuda_detail::make_qk_norm_args(plan);
            const cudaStream_t stream = cuda_detail::stream_of(plan.rope);
            if (args.total_items > 0 && plan.step.kind != QkNormKind::across_heads) {
                const int64_t tokens = plan.rope.batch * plan.rope.seq;
                const int64_t chunks = (args.groups[0] + args.groups[1] + kTokenWarps - 1) / kTokenWarps;
                const int64_t blocks = tokens * chunks;
                cuda_detail::launch_kernel(
                    "qk_norm_token_kernel",
                    cuda_detail::launch_config(unsigned(blocks < INT_MAX ? blocks : INT_MAX), kTokenWarps * kWarp,
                                               stream),
                    qk_norm_token_kernel<Storage>, args, tokens, chunks);
            } else if (args.total_items > 0) {
                constexpr int threads = 128;  // four warps, four groups per block
                const int64_t warps_per_block = threads / kWarp;
                const int64_t blocks = (args.total_items + warps_per_block - 1) / warps_per_block;
                cuda_detail::launch_kernel(
                    "qk_norm_warp_kernel",
                    cuda_detail::launch_config(unsigned(blocks < INT_MAX ? blocks : INT_MAX), threads, stream),
                    qk_norm_warp_kernel<Storage>, args);
            }
        }
        cuda_detail::copy_v<Storage>(plan);
    });
}

}  // namespace rope

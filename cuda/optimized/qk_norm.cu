// cuda-optimized's fused QK-RMSNorm + RoPE. Two kernels, chosen on the host:
//
// qk_norm_row_kernel, the common case (per-head kinds, head_dim 64, 128 or 256, rows whose
// features are contiguous and start on 16-byte boundaries, pairs that stay inside a lane's
// chunks: interleaved, or half-split over the whole head). A block takes one token, all its q
// and k heads (up to kMaxRowThreads / 4 of them: more are split over several blocks); four
// lanes (a quad) take one head row.
// - Loads: lane j of a quad reads chunks of 8 consecutive features (16 bytes of bf16 or fp16,
//   32 of fp32) at 32m + 8j, m = 0, 1, ...: the vectors j, j + 4, j + 8, ... of PyTorch's CPU
//   sum (8 lanes x 4 vector accumulators, see qk_norm_sum_of_squares). So lane j holds
//   exactly what vector accumulator j adds, in the order it adds it: each of its 8 partial sums
//   is cascade_sum over its own chunks, with no data moved. Three shuffles per partial sum
//   carry accumulator 0's sums to lane 1, which adds its own, and so on to lane 3, which then
//   adds the 8 lane sums in order: the same float32 as cpu-naive's sum, bit for bit.
// - The row stays in registers (head_dim / 4 features per lane) from the load to the store, so
//   every element is read once and written once, 16 bytes at a time, and an in-place call is
//   safe: a lane writes only the features it read. Half-split pairs (i, i + head_dim/2) fall in
//   chunks m and m + chunks/2 of the same lane; interleaved pairs (2i, 2i + 1) inside a chunk.
// - Per row, the address arithmetic is done once (the row's first element); head_dim, the
//   rounding mode and the pairing are template parameters, so the per-element arithmetic has
//   no branches (but interleaved's test for the features past rotary_dim). The weights enter
//   shared memory once per block as their norm_scale (w, or 1 + w for Gemma), and cos and sin
//   once per token, for all of its heads: the accurate sincosf is the costliest arithmetic,
//   and every head of a token turns by the same angles.
// - A decode step waits for memory once: every global read of a work item (the row, the
//   positions, the weights) is issued before the first wait for one.
// One token per block keeps a decode step's few tokens spread over as many blocks as it has.
//
// The generic kernels take every other call: one warp per norm group (a head row, or all heads
// of a token for across_heads).
// - The sum of squares: the 32 lanes are PyTorch's 8 lanes x 4 vector accumulators
//   (qk_norm_sum_of_squares), so lane l sums features (4i + l/8) * 8 + l%8: at each step
//   the warp reads 32 consecutive features, one coalesced access. Three shuffles give
//   lanes 0-7 their lane sums, eight more broadcast them, added in PyTorch's order.
// - The norm and the rotation: lane l takes pairs l, l + 32, ... of each head row of the
//   group (half-split: features i and i + rotary_dim/2, consecutive across the warp;
//   interleaved: 2i and 2i + 1), and writes the pair it read, so an in-place call needs no
//   further synchronisation.
// - cos and sin: once per token, into shared memory, for all of its heads. Per-head kinds: a
//   block holds the groups of one token (up to kTokenWarps of its q and k heads, a token's
//   heads split over several blocks where it has more), and its threads compute them.
//   across_heads (one group per token, every head of it in one warp): the warp's lanes do.
// Both kernels take the values rotation_factors gives each pair and the shared row steps
// (scaled_feature, rotate_normalized), so their results are the same bits.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../qk_norm_common.cuh"

namespace rope {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;
constexpr int kTokenWarps = 8;  // Groups (warps) per block of qk_norm_token_kernel.
static_assert(detail::kTorchLanes * detail::kTorchVectors == kWarp, "a lane per partial sum");

// ---- qk_norm_row_kernel ----

constexpr int kQuad = detail::kTorchVectors;  // Lanes per head row: one per vector accumulator.
constexpr int kChunk = detail::kTorchLanes;   // Features a lane loads at once: one PyTorch vector.
constexpr int kQuadFeatures = kQuad * kChunk;  // Features the quad covers per step (32).
constexpr int kMaxRowThreads = 256;           // Threads per block at most (more rows: more blocks).
// Blocks of kMaxRowThreads that an SM's registers must hold at once (__launch_bounds__): three
// (80 registers a thread) where a lane's share of a row is at most 64 bytes, so that more
// blocks fit on an SM and more loads are in flight; else two (128 registers).
template <typename Storage, int kHeadDim>
constexpr int kRowMinBlocks = kHeadDim * int(sizeof(Storage)) <= 256 ? 3 : 2;

// A chunk as raw 16-byte words: one (bf16, fp16) or two (fp32).
template <typename Storage>
constexpr int kWords = kChunk * int(sizeof(Storage)) / 16;
// A lane's share of a head row as raw words: chunk m holds features 32m + 8j, ... (lane j).
template <typename Storage, int kHeadDim>
using RowWords = uint4[kHeadDim / kQuadFeatures][kWords<Storage>];

// The chunk at @p at (16-byte aligned): 16-byte loads.
template <typename Storage>
__device__ inline void load_chunk(const Storage* at, uint4 (&raw)[kWords<Storage>]) {
#pragma unroll
    for (int w = 0; w < kWords<Storage>; ++w) raw[w] = reinterpret_cast<const uint4*>(at)[w];
}

// Feature @p e of a chunk, widened to float32.
template <typename Storage>
__device__ inline float feature(const uint4 (&raw)[kWords<Storage>], int e) {
    Storage v[kChunk];
    memcpy(v, raw, sizeof v);
    return to_float(v[e]);
}

// A chunk's features widened to float32.
template <typename Storage>
__device__ inline void widen(const uint4 (&raw)[kWords<Storage>], float (&x)[kChunk]) {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) x[e] = feature<Storage>(raw, e);
}

// kChunk results rounded to Storage and written at @p at (16-byte aligned): 16-byte stores.
template <typename Storage>
__device__ inline void store_chunk(Storage* at, const float (&x)[kChunk]) {
    Storage v[kChunk];
#pragma unroll
    for (int e = 0; e < kChunk; ++e) v[e] = from_float<Storage>(x[e]);
    uint4 raw[kWords<Storage>];
    memcpy(raw, v, sizeof raw);
#pragma unroll
    for (int w = 0; w < kWords<Storage>; ++w) reinterpret_cast<uint4*>(at)[w] = raw[w];
}

// kCount floats of shared memory at @p at (16-byte aligned), four at a time.
template <int kCount>
__device__ inline void load_shared(const float* at, float (&x)[kCount]) {
    static_assert(kCount % 4 == 0);
#pragma unroll
    for (int i = 0; i < kCount; i += 4) {
        const float4 v = reinterpret_cast<const float4*>(at)[i / 4];
        x[i] = v.x;
        x[i + 1] = v.y;
        x[i + 2] = v.z;
        x[i + 3] = v.w;
    }
}

// This lane's chunks of a head row (@p in: this lane's first feature) into @p raw: 16-byte loads.
template <typename Storage, int kHeadDim>
__device__ inline void load_row(const Storage* in, RowWords<Storage, kHeadDim>& raw) {
#pragma unroll
    for (int m = 0; m < kHeadDim / kQuadFeatures; ++m) load_chunk<Storage>(in + m * kQuadFeatures, raw[m]);
}

// inverse_rms of the quad's head row (this lane's chunks in @p raw), its sum of squares added in
// PyTorch's order; the same value in the four lanes.
template <typename Storage, int kHeadDim>
__device__ inline float row_inverse_rms(const RowWords<Storage, kHeadDim>& raw, float eps, int quad_lane,
                                        unsigned quad_mask) {
    constexpr int kChunks = kHeadDim / kQuadFeatures;  // Chunk m of lane j: features 32m + 8j, ...
    // With head_dim a multiple of 32 there are no leftover vectors and no tail: every feature
    // is in one of the four accumulators (torch_partial_sum, torch_tail_sum).
    static_assert(kHeadDim % kQuadFeatures == 0);
    // Accumulator j = quad_lane, PyTorch lane l: round m adds feature 32m + 8j + l, element l of
    // chunk m (torch_partial_sum of vector j, whose vector 4m + j is this lane's chunk m).
    float lane_sum[kChunk];
#pragma unroll
    for (int l = 0; l < kChunk; ++l)
        lane_sum[l] = detail::cascade_sum(kChunks, [&](int64_t m) {
            const float x = feature<Storage>(raw[m], l);
            return detail::mul_rn(x, x);
        });
    // The accumulators added in order: lane j adds its own to lanes 0..j-1's running sum.
#pragma unroll
    for (int vector = 1; vector < kQuad; ++vector)
#pragma unroll
        for (int l = 0; l < kChunk; ++l) {
            const float before = __shfl_up_sync(quad_mask, lane_sum[l], 1, kQuad);
            if (quad_lane == vector) lane_sum[l] = detail::add_rn(before, lane_sum[l]);
        }
    float total = 0.0f;  // torch_tail_sum of no tail, then the lane sums in order (lane 3 has them)
#pragma unroll
    for (int l = 0; l < kChunk; ++l) total = detail::add_rn(total, lane_sum[l]);
    return detail::inverse_rms(__shfl_sync(quad_mask, total, kQuad - 1, kQuad), kHeadDim, eps);
}

// This lane's chunks @p raw of a head row normalised with @p inverse, scaled by @p scale
// (norm_scale of each feature's weight), rotated by the token's @p cos_of and @p sin_of, and
// written from @p out (this lane's first feature), each chunk (or half-split pair of chunks) as
// soon as it is done, which keeps few values in registers at a time.
template <typename Storage, int kHeadDim, QkNormRounding kRounding, Style kStyle>
__device__ inline void normalize_rotate_store(const QkNormStep& norm, const RowWords<Storage, kHeadDim>& raw,
                                              float inverse, const float* scale, const float* cos_of,
                                              const float* sin_of, int first, Storage* out) {
    constexpr int kChunks = kHeadDim / kQuadFeatures;
    // Two features at a time, so that their roundings pair (round_pair_to).
    const auto normalized = [&](float& x, float& y, float scale_x, float scale_y) {
        detail::scaled_pair<Storage>(x, y, inverse, scale_x, scale_y, kRounding);
    };
    if constexpr (kStyle == Style::half_split) {
        // Whole-head rotation (the host checks it): pair i = 32m + 8j + e of chunk m < kChunks / 2
        // pairs with feature i + head_dim / 2, the same element of chunk m + kChunks / 2.
        constexpr int kHalf = kChunks / 2;
#pragma unroll
        for (int m = 0; m < kHalf; ++m) {
            float x[kChunk], y[kChunk], cos_angle[kChunk], sin_angle[kChunk], scale_x[kChunk], scale_y[kChunk];
            widen<Storage>(raw[m], x);
            widen<Storage>(raw[m + kHalf], y);
            load_shared(cos_of + m * kQuadFeatures + first, cos_angle);
            load_shared(sin_of + m * kQuadFeatures + first, sin_angle);
            load_shared(scale + m * kQuadFeatures + first, scale_x);
            load_shared(scale + (m + kHalf) * kQuadFeatures + first, scale_y);
#pragma unroll
            for (int e = 0; e < kChunk; ++e) {
                normalized(x[e], y[e], scale_x[e], scale_y[e]);
                detail::rotate_normalized<Storage>(x[e], y[e], cos_angle[e], sin_angle[e], kRounding);
            }
            store_chunk(out + m * kQuadFeatures, x);
            store_chunk(out + (m + kHalf) * kQuadFeatures, y);
        }
    } else {
        // Interleaved: pair i = (32m + 8j + e) / 2 is features 2i, 2i + 1 of chunk m (e even);
        // features from rotary_dim on pass through normalised.
#pragma unroll
        for (int m = 0; m < kChunks; ++m) {
            float x[kChunk], cos_angle[kChunk / 2], sin_angle[kChunk / 2], feature_scale[kChunk];
            widen<Storage>(raw[m], x);
            load_shared(cos_of + (m * kQuadFeatures + first) / 2, cos_angle);
            load_shared(sin_of + (m * kQuadFeatures + first) / 2, sin_angle);
            load_shared(scale + m * kQuadFeatures + first, feature_scale);
#pragma unroll
            for (int e = 0; e < kChunk; e += 2) {
                normalized(x[e], x[e + 1], feature_scale[e], feature_scale[e + 1]);
                if (m * kQuadFeatures + first + e < norm.rotary_dim)
                    detail::rotate_normalized<Storage>(x[e], x[e + 1], cos_angle[e / 2], sin_angle[e / 2], kRounding);
            }
            store_chunk(out + m * kQuadFeatures, x);
        }
    }
}

// Block work item w is token w / chunks, its groups [chunk * rows, (chunk + 1) * rows) with
// chunk = w % chunks (q's heads, then k's); quad r of the block takes the chunk's group r, or
// none. Each work item: the quads issue the loads of their rows (and, in a block's first item,
// its threads the weights'), the first kPairs threads compute the token's cos and sin meanwhile,
// the quads add their sums, then (barrier) the rows are finished. Every global read is issued
// before the first wait for one, so a decode step waits for memory once, and a prefill block
// waits at one barrier per token (a second, before an item's cos and sin are written, only
// from its second item on). The loop bound depends on the block alone, so every thread reaches
// every barrier; the four lanes of a quad share their row, so each quad's shuffles see all four
// lanes.
template <typename Storage, int kHeadDim, QkNormRounding kRounding, Style kStyle>
__global__ void __launch_bounds__(kMaxRowThreads, kRowMinBlocks<Storage, kHeadDim>)
    qk_norm_row_kernel(const __grid_constant__ cuda_detail::QkNormArgsDevice args, int64_t tokens, int64_t rows,
                       int64_t chunks) {
    constexpr int kPairs = kHeadDim / 2;
    __shared__ alignas(16) float scale_of[2][kHeadDim];  // norm_scale of q's and k's weights
    __shared__ alignas(16) float cos_of[kPairs], sin_of[kPairs];
    const QkNormStep& norm = args.step;
    const int quad_lane = int(threadIdx.x) % kQuad, first = kChunk * quad_lane;  // this lane's first feature
    const unsigned quad_mask = 0xfu << (int(threadIdx.x) % kWarp / kQuad * kQuad);
    const int64_t q_groups = args.groups[0], groups = args.groups[0] + args.groups[1];
    for (int64_t work = blockIdx.x; work < tokens * chunks; work += gridDim.x) {
        if (work != blockIdx.x) __syncthreads();  // The previous work item's readers are done with cos_of and sin_of.
        const int64_t token = work / chunks, b = token / args.seq, s = token % args.seq;
        const int64_t group = work % chunks * rows + threadIdx.x / kQuad;
        const bool active = int64_t(threadIdx.x / kQuad) < rows && group < groups;  // the same in a quad
        const int which = group < q_groups ? 0 : 1;
        const int64_t h = which == 0 ? group : group - q_groups;
        const Operand& tensor = norm.operands[which].tensor;
        TokenPositions positions{};
        if (int(threadIdx.x) < kPairs) positions = token_positions(args.positions, norm.axes, b, s);
        RowWords<Storage, kHeadDim> raw;  // The row waits in registers as loaded (bf16: half of float32's).
        if (active)
            load_row<Storage, kHeadDim>(
                static_cast<const Storage*>(tensor.in) + tensor.in_geometry.offset(b, h, s, 0) + first, raw);
        if (work == blockIdx.x) {  // Read after the barrier below; never written again.
            for (int i = int(threadIdx.x); i < 2 * kHeadDim; i += int(blockDim.x)) {
                const NormOperand& operand = norm.operands[i / kHeadDim];
                const float weight = operand.tensor.in_geometry.heads > 0
                                         ? detail::weight_at(operand.weight, operand.weight_dtype, i % kHeadDim)
                                         : 0.0f;
                scale_of[i / kHeadDim][i % kHeadDim] = detail::norm_scale(weight, norm.kind);
            }
        }
        // The token's cos and sin while the row's loads are in flight: the accurate sincosf's
        // latency hides behind the memory's instead of following it.
        for (int i = int(threadIdx.x); i < kPairs; i += int(blockDim.x)) {
            if (i < norm.pairs) {
                rotation_factors(args.angles, positions.of_pair(args.angles, norm.axes, i), i, cos_of[i], sin_of[i]);
            } else {  // Read by the 16-byte loads beside rotated pairs, never used.
                cos_of[i] = 1.0f;
                sin_of[i] = 0.0f;
            }
        }
        const float inverse =
            active ? row_inverse_rms<Storage, kHeadDim>(raw, norm.eps, quad_lane, quad_mask) : 0.0f;
        __syncthreads();  // cos_of, sin_of and scale_of are written.
        if (active) {
            normalize_rotate_store<Storage, kHeadDim, kRounding, kStyle>(
                norm, raw, inverse, scale_of[which], cos_of, sin_of, first,
                static_cast<Storage*>(tensor.out) + tensor.out_geometry.offset(b, h, s, 0) + first);
        }
    }
}

// ---- the generic kernels ----

// inverse_rms of the group of head first_head (all heads from 0 for across_heads) of token (b, s),
// the sum added in PyTorch's order (see the top of the file); the same value in every lane.
template <typename Storage>
__device__ float warp_group_inverse_rms(const QkNormStep& norm, const NormOperand& operand, int64_t b,
                                        int64_t first_head, int64_t s, int lane) {
    const Geometry& g = operand.tensor.in_geometry;
    const auto* in = static_cast<const Storage*>(operand.tensor.in);
    const int64_t n = detail::group_features(norm, operand), head_dim = norm.head_dim;
    const bool across = norm.kind == QkNormKind::across_heads;
    const Storage* row = in + g.offset(b, first_head, s, 0);  // per-head kinds: the group is this row
    const auto load = [&](int64_t f) {
        return to_float(across ? in[g.offset(b, f / head_dim, s, f % head_dim)] : row[f * g.stride_dim]);
    };
    const float partial = detail::torch_partial_sum(n, lane / detail::kTorchLanes, lane % detail::kTorchLanes, load);
    float lane_sum = partial;  // lanes 0-7: vector 0's, then vectors 1, 2, 3 added in order
    for (int vector = 1; vector < detail::kTorchVectors; ++vector)
        lane_sum = detail::add_rn(lane_sum, __shfl_down_sync(kFullMask, partial, vector * detail::kTorchLanes));
    float total = detail::torch_tail_sum(n, load);
    for (int l = 0; l < detail::kTorchLanes; ++l) total = detail::add_rn(total, __shfl_sync(kFullMask, lane_sum, l));
    return detail::inverse_rms(total, n, norm.eps);
}

// across_heads: warp w of the grid takes group w (grid-stride), every head of it. Lane l
// computes cos and sin of its pairs l, l + 32, ... once per token, into its warp's slice of
// shared memory, and reads them back for each head: a lane reads only what it wrote, so no
// synchronisation is needed.
constexpr int kGroupWarps = 4;  // Warps (groups) per block of qk_norm_warp_kernel.
template <typename Storage>
__global__ void qk_norm_warp_kernel(const __grid_constant__ cuda_detail::QkNormArgsDevice args) {
    __shared__ float cos_of[kGroupWarps][cuda_detail::kMaxPairs], sin_of[kGroupWarps][cuda_detail::kMaxPairs];
    const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
    const int64_t step = int64_t(gridDim.x) * kGroupWarps;
    const QkNormStep& norm = args.step;
    // item is the same in every lane of a warp: the shuffles see all 32 lanes.
    for (int64_t item = int64_t(blockIdx.x) * kGroupWarps + warp; item < args.total_items; item += step) {
        const cuda_detail::QkNormItem at = cuda_detail::qk_norm_item(args, item);
        const NormOperand& operand = norm.operands[at.which];
        const bool across = norm.kind == QkNormKind::across_heads;
        const int64_t first_head = across ? 0 : at.group;
        const float inverse = warp_group_inverse_rms<Storage>(norm, operand, at.b, first_head, at.s, lane);
        const TokenPositions positions = token_positions(args.positions, norm.axes, at.b, at.s);
        for (int64_t i = lane; i < norm.pairs; i += kWarp)
            rotation_factors(args.angles, positions.of_pair(args.angles, norm.axes, i), i, cos_of[warp][i],
                             sin_of[warp][i]);
        const auto factors = [&](int64_t i, float& cos_angle, float& sin_angle) {
            cos_angle = cos_of[warp][i];
            sin_angle = sin_of[warp][i];
        };
        const int64_t last_head = across ? operand.tensor.in_geometry.heads : at.group + 1;
        for (int64_t h = first_head; h < last_head; ++h)
            detail::normalize_rotate_head_with<Storage>(norm, factors, operand, at.b, h, at.s, inverse, lane, kWarp);
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

// Whether every row of @p g at @p data is contiguous and starts on a 16-byte boundary (an
// operand without heads has no rows).
bool rows_vectorizable(const Geometry& g, const void* data, int64_t element_size) {
    if (g.heads == 0) return true;
    const auto aligned = [&](int64_t extent, int64_t stride) { return extent <= 1 || stride * element_size % 16 == 0; };
    return g.stride_dim == 1 && reinterpret_cast<uintptr_t>(data) % 16 == 0 && aligned(g.batch, g.stride_batch) &&
           aligned(g.heads, g.stride_head) && aligned(g.seq, g.stride_seq);
}

// Whether qk_norm_row_kernel takes @p plan (see the top of the file).
bool row_kernel_takes(const QkNormPlan& plan) {
    const QkNormStep& norm = plan.step;
    const bool head_dim = norm.head_dim == 64 || norm.head_dim == 128 || norm.head_dim == 256;
    const bool pairs_in_lane = norm.style == Style::interleaved ||
                               (norm.style == Style::half_split && norm.rotary_dim == norm.head_dim);
    if (norm.kind == QkNormKind::across_heads || !head_dim || !pairs_in_lane) return false;
    const int64_t size = dtype_size(plan.rope.dtype);
    for (const NormOperand& operand : norm.operands)
        if (!rows_vectorizable(operand.tensor.in_geometry, operand.tensor.in, size) ||
            !rows_vectorizable(operand.tensor.out_geometry, operand.tensor.out, size))
            return false;
    return true;
}

// One block per token and up to kMaxRowThreads / 4 of its groups (grid-stride beyond INT_MAX),
// four lanes per head row.
template <typename Storage, int kHeadDim>
void launch_row_kernel(const QkNormPlan& plan, const cuda_detail::QkNormArgsDevice& args, cudaStream_t stream) {
    const int64_t tokens = plan.rope.batch * plan.rope.seq, groups = args.groups[0] + args.groups[1];
    const int64_t chunks = (groups * kQuad + kMaxRowThreads - 1) / kMaxRowThreads;
    const int64_t rows = (groups + chunks - 1) / chunks;  // the chunks as even as they go
    const int64_t threads = (rows * kQuad + kWarp - 1) / kWarp * kWarp;
    const int64_t blocks = tokens * chunks;
    const cudaLaunchConfig_t config =
        cuda_detail::launch_config(unsigned(std::min<int64_t>(blocks, INT_MAX)), unsigned(threads), stream);
    const auto launch = [&](auto kernel) {
        cuda_detail::launch_kernel("qk_norm_row_kernel", config, kernel, args, tokens, rows, chunks);
    };
    const bool half = plan.step.style == Style::half_split;
    const auto launch_rounding = [&](auto rounding) {  // rounding: the mode, as a type.
        constexpr QkNormRounding kRounding = decltype(rounding)::value;
        return half ? launch(qk_norm_row_kernel<Storage, kHeadDim, kRounding, Style::half_split>)
                    : launch(qk_norm_row_kernel<Storage, kHeadDim, kRounding, Style::interleaved>);
    };
    using R = QkNormRounding;
    switch (plan.step.rounding) {
        case R::float32: return launch_rounding(std::integral_constant<R, R::float32>{});
        case R::hf_qwen3: return launch_rounding(std::integral_constant<R, R::hf_qwen3>{});
        case R::hf_gemma3: return launch_rounding(std::integral_constant<R, R::hf_gemma3>{});
        case R::hf_olmo2: return launch_rounding(std::integral_constant<R, R::hf_olmo2>{});
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
            if (args.total_items > 0 && row_kernel_takes(plan)) {
                if (plan.step.head_dim == 64) launch_row_kernel<Storage, 64>(plan, args, stream);
                if (plan.step.head_dim == 128) launch_row_kernel<Storage, 128>(plan, args, stream);
                if (plan.step.head_dim == 256) launch_row_kernel<Storage, 256>(plan, args, stream);
            } else if (args.total_items > 0 && plan.step.kind != QkNormKind::across_heads) {
                const int64_t tokens = plan.rope.batch * plan.rope.seq;
                const int64_t chunks = (args.groups[0] + args.groups[1] + kTokenWarps - 1) / kTokenWarps;
                const int64_t blocks = tokens * chunks;
                cuda_detail::launch_kernel(
                    "qk_norm_token_kernel",
                    cuda_detail::launch_config(unsigned(blocks < INT_MAX ? blocks : INT_MAX), kTokenWarps * kWarp,
                                               stream),
                    qk_norm_token_kernel<Storage>, args, tokens, chunks);
            } else if (args.total_items > 0) {
                const int64_t blocks = (args.total_items + kGroupWarps - 1) / kGroupWarps;
                cuda_detail::launch_kernel("qk_norm_warp_kernel",
                                           cuda_detail::launch_config(unsigned(blocks < INT_MAX ? blocks : INT_MAX),
                                                                      kGroupWarps * kWarp, stream),
                                           qk_norm_warp_kernel<Storage>, args);
            }
        }
        cuda_detail::copy_v<Storage>(plan);
    });
}

}  // namespace rope

#pragma once
/// @file tile_kernel.cuh
/// @brief cuda-optimized's kernel and its launch (internal to the CUDA backends).
///
/// RoPE does a handful of flops per element against 4 to 16 bytes of traffic
/// (read once, written once), so its ceiling is a device-to-device copy of the
/// same bytes. The kernel is shaped to look to the memory system like that
/// copy, with the trigonometry moved out of the way:
///
///  1. cos/sin once per (token, pair), in shared memory. Each block owns a
///     tile (tiling.hpp): consecutive tokens times consecutive head rows. It
///     first computes the cos/sin of its tokens, every pair once, into shared
///     memory; then every row of q and k in the tile reuses them. Whatever the
///     positions are (an offset, ids, packed sequences, several axes, a
///     caller's table), that work happens here, once per token, and the
///     streaming below is the same for every form.
///  2. A stream of wide, coalesced accesses. The tile's rows are then moved
///     as *chunks* of two 16-byte vectors (row_access.cuh, vector_layout.hpp),
///     numbered in memory order, neighbouring threads taking neighbouring
///     chunks: a warp reads and writes whole contiguous runs, as a copy does.
///  3. Bytes in flight. A load takes about a microsecond to return; to keep
///     the memory system busy each SM needs tens of kilobytes requested at
///     once. Each thread loads a batch of ItemsInFlight chunks before it uses
///     the first, and issues its first batch before the cos/sin are computed.
///  4. A grid shaped for both regimes (tiling.hpp): many tiles of whole
///     tokens for long sequences, a few rows per tile for decode so every SM
///     fetches a little.
///  5. A prologue that overlaps the previous kernel (programmatic dependent
///     launch, Hopper). With it, the grid starts before the previous kernel in
///     the stream has finished; what needs no memory (the indices, and the
///     cos/sin of offset positions) runs then, and only memory traffic waits
///     for the previous kernel (PreviousGrid).
///
/// Indices are int64 throughout: q tensors beyond 2^31 elements are routine
/// at long context, and 32-bit index overflow is a bug that shipped in
/// several public RoPE kernels.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "check.hpp"
#include "fast_divisor.cuh"
#include "kernel_args.cuh"
#include "rope/detail/pair_step.hpp"
#include "row_access.cuh"
#include "tiling.hpp"

namespace rope::cuda_detail {

/// Largest block the kernel is compiled for (its __launch_bounds__).
inline constexpr int kMaxBlockThreads = 512;

/// @brief Everything the kernel needs, passed by value (kernel_args.cuh says why).
template <int Capacity>
struct TileArgs {
    Operand operands[2];       ///< [0] = q, [1] = k (k may have no heads).
    PositionSource positions;  ///< Offset, ids, or packed sequences; perhaps a context-parallel shard.
    AngleArgs<Capacity> angles;  ///< theta_i, pair axes, scales, or a caller's table.
    int64_t axes;              ///< Position axes per token.
    int64_t rotary_dim;
    int64_t seq;               ///< Tokens per sequence (token -> (b, s)).
    int64_t tokens;            ///< batch * seq.
    int64_t q_heads;           ///< Rows [0, q_heads) of a token are q's heads, the rest k's.
    int64_t rows;              ///< q heads + k heads.
    int64_t rotary_chunks;     ///< Chunks of a row that rotate.
    int64_t pass_chunks;       ///< Chunks of pass-through features to copy (0 when in place).
    int64_t slots;             ///< rotary_chunks * kPairs: cos/sin entries per token.
    int64_t tile_tokens;       ///< Tiling::tile_tokens.
    int64_t tile_rows;         ///< Tiling::tile_rows.
    int64_t token_tiles;       ///< Tiles along the tokens.
    int64_t tiles;             ///< token_tiles * row tiles.
    bool rows_outer;           ///< Memory order: a row's tokens adjacent (bhsd) or a token's rows (bshd, thd).
    bool positions_in_memory;  ///< Ids, cu_seqlens or a table: read only after the previous kernel.
    FastDivisor by_seq;        ///< token -> (b, s).
    FastDivisor by_slots;      ///< cos/sin entry -> (token, slot).
    FastDivisor by_token_tiles;  ///< tile -> (row tile, token tile).
    FastDivisor by_rotary_chunks;  ///< item -> (rest, chunk).
    FastDivisor by_pass_chunks;    ///< pass item -> (rest, chunk).
    FastDivisor by_tile_tokens;    ///< rest -> (row, token) when rows are outer.
    FastDivisor by_tile_rows;      ///< rest -> (token, row) when tokens are outer.
};

/// @brief Waits, once per thread, until the previous kernel in the stream has
/// finished and its writes are visible (programmatic dependent launch, 5. above).
/// Without programmatic launch the wait returns at once.
struct PreviousGrid {
    bool done = false;
    /// Waits if this thread has not yet.
    __device__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (!done) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
        done = true;
    }
};

/// The tile a block is working on: its first token and row, and how many of each it really has.
struct Tile {
    int64_t first_token;
    int64_t tokens;
    int64_t first_row;
    int64_t rows;
};

template <int Capacity>
__device__ inline Tile tile_at(const TileArgs<Capacity>& args, int64_t tile) {
    const int64_t row_tile = args.by_token_tiles.divide(tile);
    const int64_t token_tile = tile - row_tile * args.token_tiles;
    Tile t;
    t.first_token = token_tile * args.tile_tokens;
    t.tokens = min(args.tile_tokens, args.tokens - t.first_token);
    t.first_row = row_tile * args.tile_rows;
    t.rows = min(args.tile_rows, args.rows - t.first_row);
    return t;
}

/// Row @p row (q's head, or k's head row - q_heads) of token @p token, in input and output.
///
/// Written with selects on fixed fields (not operands[row >= q_heads]) so the
/// compiler reads every stride straight from the constant bank.
template <typename Storage, int Capacity>
__device__ inline RowRef<Storage> locate_row(const TileArgs<Capacity>& args, int64_t token, int64_t row) {
    const int64_t b = args.by_seq.divide(token);
    const int64_t s = token - b * args.seq;
    const bool is_q = row < args.q_heads;
    const Operand& operand = is_q ? args.operands[0] : args.operands[1];
    const int64_t h = is_q ? row : row - args.q_heads;
    const Geometry& in = operand.in_geometry;
    const Geometry& out = operand.out_geometry;
    return {static_cast<const Storage*>(operand.in) + in.offset(b, h, s, 0),
            static_cast<Storage*>(operand.out) + out.offset(b, h, s, 0), in.stride_dim, out.stride_dim};
}

/// Work item @p item of a tile with @p chunks chunks per row, in memory order:
/// which (token, row) and which chunk. Items past the tile's real extent (a
/// partial last tile) come back with valid = false.
struct Item {
    int64_t token;
    int64_t row;
    int64_t chunk;
    bool valid;
};

template <int Capacity>
__device__ inline Item item_at(const TileArgs<Capacity>& args, const Tile& tile, int64_t item,
                               const FastDivisor& by_chunks) {
    const int64_t rest = by_chunks.divide(item);
    Item at;
    at.chunk = item - rest * by_chunks.divisor;
    int64_t t, r;
    if (args.rows_outer) {
        r = args.by_tile_tokens.divide(rest);
        t = rest - r * args.tile_tokens;
    } else {
        t = args.by_tile_rows.divide(rest);
        r = rest - t * args.tile_rows;
    }
    at.valid = t < tile.tokens && r < tile.rows;
    at.token = tile.first_token + t;
    at.row = tile.first_row + r;
    return at;
}

/// 1. The cos/sin of every (token, slot) of the tile, into shared memory:
/// cos_table[t * slots + slot], where slot = chunk * kPairs + p holds pair
/// Path::pair_of(chunk, p), so a chunk's factors are kPairs consecutive floats.
template <typename Path, int Capacity>
__device__ inline void fill_tile_factors(const TileArgs<Capacity>& args, const Tile& tile, float* cos_table,
                                         float* sin_table) {
    const int64_t entries = tile.tokens * args.slots;
    for (int64_t e = threadIdx.x; e < entries; e += blockDim.x) {
        const int64_t t = args.by_slots.divide(e);
        const int64_t slot = e - t * args.slots;
        const int64_t chunk = slot / Path::kPairs;
        const int64_t pair = Path::pair_of(chunk, int(slot - chunk * Path::kPairs), args.rotary_dim);
        const int64_t token = tile.first_token + t;
        const int64_t b = args.by_seq.divide(token);
        const TokenPositions positions = token_positions(args.positions, args.axes, b, token - b * args.seq);
        rotation_factors(args.angles, positions.of_axis(args.angles.pair_axis[pair]), pair, cos_table[e], sin_table[e]);
    }
}

/// A chunk's kPairs cos and sin, from shared memory into registers (16-byte reads where they fit).
template <int kPairs>
__device__ inline void read_factors(const float* cos_entry, const float* sin_entry, float (&cos_angle)[kPairs],
                                    float (&sin_angle)[kPairs]) {
    if constexpr (kPairs % 4 == 0) {
#pragma unroll
        for (int p = 0; p < kPairs; p += 4) {
            const float4 c = *reinterpret_cast<const float4*>(cos_entry + p);
            const float4 s = *reinterpret_cast<const float4*>(sin_entry + p);
            cos_angle[p] = c.x, cos_angle[p + 1] = c.y, cos_angle[p + 2] = c.z, cos_angle[p + 3] = c.w;
            sin_angle[p] = s.x, sin_angle[p + 1] = s.y, sin_angle[p + 2] = s.z, sin_angle[p + 3] = s.w;
        }
    } else {
#pragma unroll
        for (int p = 0; p < kPairs; ++p) cos_angle[p] = cos_entry[p], sin_angle[p] = sin_entry[p];
    }
}

/// @brief The kernel: one tile per block (a grid-stride loop covers grids beyond the launch limit).
///
/// __grid_constant__ lets device functions take references into the
/// parameters without a per-thread copy to local memory.
template <typename Storage, typename Path, int ItemsInFlight, int Capacity>
__global__ void __launch_bounds__(kMaxBlockThreads)
    rope_tile_kernel(const __grid_constant__ TileArgs<Capacity> args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Programmatic dependent launch (5. above): let the next kernel in the
    // stream start its own prologue while this one runs.
    asm volatile("griddepcontrol.launch_dependents;");
#endif
    extern __shared__ float4 shared[];  // float4: 16-byte alignment for read_factors.
    float* const cos_table = reinterpret_cast<float*>(shared);
    float* const sin_table = cos_table + args.tile_tokens * args.slots;
    PreviousGrid previous;

    for (int64_t tile_index = blockIdx.x; tile_index < args.tiles; tile_index += gridDim.x) {
        const Tile tile = tile_at(args, tile_index);
        if (tile_index != blockIdx.x) __syncthreads();  // The previous tile's factors are no longer read.

        // The first batch's loads go out before the trigonometry, which then
        // runs while they are in flight (3. above). Offset positions need no
        // memory: their cos/sin are computed even before waiting for the
        // previous kernel (5. above).
        if (!args.positions_in_memory) fill_tile_factors<Path>(args, tile, cos_table, sin_table);
        previous.wait();

        const int64_t rotary_items = args.tile_tokens * args.tile_rows * args.rotary_chunks;
        const int64_t step = int64_t(blockDim.x) * ItemsInFlight;
        typename Path::Chunk data[ItemsInFlight];
        Item at[ItemsInFlight];
        auto load_batch = [&](int64_t first) {
#pragma unroll
            for (int u = 0; u < ItemsInFlight; ++u) {
                const int64_t item = first + int64_t(u) * blockDim.x;
                at[u] = item < rotary_items ? item_at(args, tile, item, args.by_rotary_chunks) : Item{0, 0, 0, false};
                if (at[u].valid)
                    data[u] = Path::load(locate_row<Storage>(args, at[u].token, at[u].row), at[u].chunk, args.rotary_dim);
            }
        };
        load_batch(threadIdx.x);
        if (args.positions_in_memory) fill_tile_factors<Path>(args, tile, cos_table, sin_table);
        __syncthreads();  // Every factor of the tile is in shared memory.

        // 2. The rows: rotate and store the batch in hand, load the next.
        for (int64_t first = threadIdx.x; first < rotary_items; first += step) {
            if (first != threadIdx.x) load_batch(first);
#pragma unroll
            for (int u = 0; u < ItemsInFlight; ++u) {
                if (!at[u].valid) continue;
                const int64_t entry = (at[u].token - tile.first_token) * args.slots + at[u].chunk * Path::kPairs;
                float cos_angle[Path::kPairs], sin_angle[Path::kPairs];
                read_factors(cos_table + entry, sin_table + entry, cos_angle, sin_angle);
                Path::rotate(data[u], cos_angle, sin_angle);
                Path::store(locate_row<Storage>(args, at[u].token, at[u].row), at[u].chunk, args.rotary_dim, data[u]);
            }
        }

        // Partial rotary, out of place: the pass-through features are copied
        // as stored (an in-place operand already has them where they belong).
        const int64_t pass_items = args.tile_tokens * args.tile_rows * args.pass_chunks;
        for (int64_t first = threadIdx.x; first < pass_items; first += step) {
            typename Path::Pass pass[ItemsInFlight];
#pragma unroll
            for (int u = 0; u < ItemsInFlight; ++u) {
                const int64_t item = first + int64_t(u) * blockDim.x;
                at[u] = item < pass_items ? item_at(args, tile, item, args.by_pass_chunks) : Item{0, 0, 0, false};
                const Operand& operand = args.operands[at[u].row < args.q_heads ? 0 : 1];
                at[u].valid = at[u].valid && operand.in != operand.out;
                if (at[u].valid)
                    pass[u] = Path::load_pass(locate_row<Storage>(args, at[u].token, at[u].row),
                                              args.rotary_dim + at[u].chunk * Path::kPassWidth);
            }
#pragma unroll
            for (int u = 0; u < ItemsInFlight; ++u)
                if (at[u].valid)
                    Path::store_pass(locate_row<Storage>(args, at[u].token, at[u].row),
                                     args.rotary_dim + at[u].chunk * Path::kPassWidth, pass[u]);
        }
    }
}

/// True when @p address is a multiple of 16 bytes.
inline bool aligned16(const void* address) { return reinterpret_cast<uintptr_t>(address) % 16 == 0; }

/// True when every row of @p g starting at @p data is contiguous and 16-byte aligned.
template <typename Storage>
bool rows_vectorizable(const void* data, const Geometry& g) {
    if (g.stride_dim != 1 || !aligned16(data)) return false;
    // A stride matters only along an axis with more than one index.
    const int64_t axes[3][2] = {{g.batch, g.stride_batch}, {g.heads, g.stride_head}, {g.seq, g.stride_seq}};
    for (const auto& axis : axes)
        if (axis[0] > 1 && (axis[1] * int64_t(sizeof(Storage))) % 16 != 0) return false;
    return true;
}

/// @brief Whether the 16-byte path can run @p plan (otherwise the generic path does).
template <typename Storage>
bool vector_path_fits(const Plan& plan) {
    if (!splits_into_vectors(plan.rotary_dim, plan.head_dim, vector_width<Storage>())) return false;
    for (const Operand* operand : {&plan.q, &plan.k}) {
        if (operand->in_geometry.heads == 0) continue;
        if (!rows_vectorizable<Storage>(operand->in, operand->in_geometry)) return false;
        if (!rows_vectorizable<Storage>(operand->out, operand->out_geometry)) return false;
    }
    return true;
}

/// @brief What the launch needs to know about the current device.
struct DeviceInfo {
    int multiprocessors = 0;           ///< SMs (132 on an H200).
    bool programmatic_launch = false;  ///< Compute capability >= 9.0: programmatic dependent launch.
};

/// @brief Reads DeviceInfo for CUDA device @p device (attribute queries only: no synchronisation).
inline DeviceInfo device_info(int device) {
    DeviceInfo info;
    check_cuda(cudaDeviceGetAttribute(&info.multiprocessors, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    int major = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
               "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMajor)");
    info.programmatic_launch = major >= 9;
    return info;
}

/// @brief Builds the kernel arguments and tiles for @p plan and launches on plan.stream.
/// @tparam Path VectorPath or GenericPath, for the plan's storage and style.
/// @tparam ItemsInFlight chunks each thread loads before using the first.
/// @tparam Capacity pairs the angle arguments hold (>= plan.pairs).
template <typename Storage, typename Path, int ItemsInFlight, int Capacity>
void launch_tiles(const Plan& plan, const DeviceInfo& device, const TileSettings& settings) {
    TileArgs<Capacity> args{};
    args.operands[0] = plan.q;
    args.operands[1] = plan.k;
    args.positions = plan.positions;
    args.angles = make_angle_args<Capacity>(plan);
    args.axes = plan.axes;
    args.rotary_dim = plan.rotary_dim;
    args.seq = plan.seq;
    args.tokens = plan.batch * plan.seq;
    args.q_heads = plan.q.in_geometry.heads;
    args.rows = plan.q.in_geometry.heads + plan.k.in_geometry.heads;
    args.rotary_chunks = plan.pairs / Path::kPairs;
    const bool copy_needed = (plan.q.in_geometry.heads > 0 && plan.q.in != plan.q.out) ||
                             (plan.k.in_geometry.heads > 0 && plan.k.in != plan.k.out);
    args.pass_chunks = copy_needed ? (plan.head_dim - plan.rotary_dim) / Path::kPassWidth : 0;
    args.slots = args.rotary_chunks * Path::kPairs;
    if (args.tokens == 0 || args.rows == 0) return;

    const Tiling tiling = choose_tiling(args.tokens, args.rows, args.rotary_chunks + args.pass_chunks, plan.pairs,
                                        device.multiprocessors, ItemsInFlight, settings);
    args.tile_tokens = tiling.tile_tokens;
    args.tile_rows = tiling.tile_rows;
    args.token_tiles = (args.tokens + args.tile_tokens - 1) / args.tile_tokens;
    args.tiles = args.token_tiles * ((args.rows + args.tile_rows - 1) / args.tile_rows);
    const Geometry& q = plan.q.in_geometry;
    args.rows_outer = q.heads > 1 ? q.stride_head > q.stride_seq : true;
    args.positions_in_memory = plan.positions.ids != nullptr || plan.positions.cu_seqlens != nullptr ||
                               plan.angles.table.data != nullptr;
    args.by_seq = FastDivisor(args.seq);
    args.by_slots = FastDivisor(args.slots);
    args.by_token_tiles = FastDivisor(args.token_tiles);
    args.by_rotary_chunks = FastDivisor(std::max<int64_t>(args.rotary_chunks, 1));
    args.by_pass_chunks = FastDivisor(std::max<int64_t>(args.pass_chunks, 1));
    args.by_tile_tokens = FastDivisor(args.tile_tokens);
    args.by_tile_rows = FastDivisor(args.tile_rows);

    const size_t shared_bytes = size_t(2 * args.tile_tokens * args.slots) * sizeof(float);
    cudaLaunchConfig_t config =
        launch_config(dim3(static_cast<unsigned>(std::min<int64_t>(args.tiles, INT_MAX))),  // The tile loop covers the rest.
                      dim3(static_cast<unsigned>(tiling.threads)), stream_of(plan), shared_bytes);
    // See the kernel's griddepcontrol: the launch may overlap the previous kernel's tail.
    cudaLaunchAttribute programmatic{};
    programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    programmatic.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &programmatic;
    config.numAttrs = device.programmatic_launch ? 1 : 0;
    launch_kernel("rope_tile_kernel", config, rope_tile_kernel<Storage, Path, ItemsInFlight, Capacity>, args);
}

}  // namespace rope::cuda_detail

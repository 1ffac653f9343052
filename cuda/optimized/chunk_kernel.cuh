#pragma once
/// @file chunk_kernel.cuh
/// @brief cuda-optimized's kernel for calls that fill the GPU: one thread, one chunk of
/// one row (internal to the CUDA backends).
///
/// Chapter 4's ladder found it first: once the work fills the GPU many times
/// over, its simplest fast step, v4 (16-byte vectors, one thread per chunk,
/// every thread computing cos/sin of its own pairs), keeps up with a copy,
/// and reusing cos/sin across the heads of a token (v5, and the unit kernel
/// in unit_kernel.cuh) does not make it faster. Reuse saves arithmetic, which
/// a memory-bound kernel has to spare, and spends what it is short of:
/// a thread that walks several rows keeps them and their cos/sin in registers
/// (the unit kernel's instantiations hold 102-134 per thread), so fewer
/// threads fit on an SM and fewer bytes are requested at once. This kernel's
/// threads hold one chunk each: about 40 registers, the SM full of threads.
///
/// What it keeps from the unit kernel: the 16-byte chunks (row_access.cuh),
/// the shared position and cos/sin steps, the prologue that overlaps the
/// previous kernel (prologue.cuh), 64-bit indices. Threads are numbered in the
/// order of each operand's rows in memory (RowNumbering), so consecutive
/// threads take consecutive 16-byte pieces and a warp reads one contiguous
/// stretch. blockIdx.y picks the operand: 0 for q, 1 for k.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "check.hpp"
#include "device_launch.cuh"
#include "fast_divisor.cuh"
#include "kernel_args.cuh"
#include "prologue.cuh"
#include "rope/detail/pair_step.hpp"
#include "row_access.cuh"

namespace rope::cuda_detail {

/// Threads per block of the chunk kernel (its __launch_bounds__).
inline constexpr int kChunkBlockThreads = 256;

/// @brief Row r of an operand, numbered in the order of its memory, as (b, h, s).
struct RowNumbering {
    /// True when the rows of one token are neighbours in memory (bshd, thd):
    /// r = (b * seq + s) * heads + h. False (bhsd): r = (b * heads + h) * seq + s.
    bool heads_inner;
    FastDivisor by_inner;   ///< heads if heads_inner, else seq.
    FastDivisor by_middle;  ///< seq if heads_inner, else heads.

    /// @brief Numbers the rows of @p g (an operand's input) in its memory order.
    static RowNumbering of(const Geometry& g) {
        const bool heads_inner = g.heads > 1 && g.seq > 1 && g.stride_head < g.stride_seq;
        // k may have no heads (and no sizes): its blocks are never launched then.
        const int64_t heads = std::max<int64_t>(g.heads, 1), seq = std::max<int64_t>(g.seq, 1);
        return heads_inner ? RowNumbering{true, FastDivisor(heads), FastDivisor(seq)}
                           : RowNumbering{false, FastDivisor(seq), FastDivisor(heads)};
    }

    /// @brief (b, h, s) of row @p row.
    __device__ void split(int64_t row, int64_t& b, int64_t& h, int64_t& s) const {
        const int64_t outer = by_inner.divide(row);
        const int64_t inner = row - outer * by_inner.divisor;
        b = by_middle.divide(outer);
        const int64_t middle = outer - b * by_middle.divisor;
        h = heads_inner ? inner : middle;
        s = heads_inner ? middle : inner;
    }
};

/// @brief Everything the chunk kernel needs, passed by value (kernel_args.cuh says why).
template <int Capacity>
struct ChunkArgs {
    Operand operands[2];         ///< [0] = q, [1] = k.
    RowNumbering numbering[2];   ///< Each operand's rows in its memory order.
    int64_t items[2];            ///< Threads each operand needs: its rows times chunks per row.
    PositionSource positions;    ///< Offset, ids or packed sequences; perhaps a context-parallel shard.
    AngleArgs<Capacity> angles;  ///< theta_i, pair axes and scales (the default angle only).
    int64_t axes;                ///< Position axes per token.
    bool positions_in_memory;    ///< Ids or cu_seqlens: read only after the previous kernel.
    int64_t rotary_dim;
    int64_t rotary_chunks;       ///< Chunks of a row that rotate; the rest of a row's chunks pass through.
    FastDivisor by_chunks;       ///< Chunks per row: item -> (row, chunk).
};

/// Rotates (or, past the rotary chunks, copies) the chunk of operand @p kOperand that
/// thread item @p item owns. The operand is a template argument so that every field
/// is read straight from the constant bank.
template <typename Storage, typename Path, bool kLoadsFirst, int kOperand, int Capacity>
__device__ inline void rotate_chunk(const ChunkArgs<Capacity>& args, const SharedAngles& angles, int64_t item) {
    const Operand& operand = args.operands[kOperand];
    const int64_t row = args.by_chunks.divide(item);
    const int64_t chunk = item - row * args.by_chunks.divisor;
    int64_t b, h, s;
    args.numbering[kOperand].split(row, b, h, s);
    const RowRef<Storage> ref{static_cast<const Storage*>(operand.in) + operand.in_geometry.offset(b, h, s, 0),
                              static_cast<Storage*>(operand.out) + operand.out_geometry.offset(b, h, s, 0),
                              operand.in_geometry.stride_dim, operand.out_geometry.stride_dim};
    PreviousGrid previous;
    if (chunk < args.rotary_chunks) {
        typename Path::Chunk data;
        float cos_angle[Path::kPairs], sin_angle[Path::kPairs];
        load_with_factors<Path, true, kLoadsFirst>(
            args, angles, b, s, chunk, previous, [&] { data = Path::load(ref, chunk, args.rotary_dim); }, cos_angle,
            sin_angle);
        Path::rotate(data, cos_angle, sin_angle);
        Path::store(ref, chunk, args.rotary_dim, data);
    } else if (operand.in != operand.out) {  // In place, pass-through features already are where they belong.
        const int64_t feature = args.rotary_dim + (chunk - args.rotary_chunks) * Path::kPassWidth;
        previous.wait();
        Path::store_pass(ref, feature, Path::load_pass(ref, feature));
    }
}

/// @brief The kernel: thread item (blockIdx.x, threadIdx.x) of operand blockIdx.y.
/// @tparam kLoadsFirst a thread issues its loads before it computes cos/sin, so
///         that the arithmetic runs while the bytes are in flight: with one chunk
///         per thread nothing else would hide it (the backend's choice; false,
///         cos/sin first as the unit kernel does for offsets, is timed by rope-tune).
template <typename Storage, typename Path, int Capacity, bool kLoadsFirst = true>
__global__ void __launch_bounds__(kChunkBlockThreads)
    rope_chunk_kernel(const __grid_constant__ ChunkArgs<Capacity> args) {
    allow_next_kernel();  // Programmatic dependent launch (prologue.cuh).
    // theta_i into shared memory (SharedAngles says why), by every thread before any returns.
    __shared__ float inv_freq[Capacity];
    for (int64_t pair = threadIdx.x; pair < args.rotary_dim / 2; pair += blockDim.x)
        inv_freq[pair] = args.angles.inv_freq[pair];
    __syncthreads();
    const SharedAngles angles{inv_freq, args.angles.pair_axis, args.angles.cos_scale, args.angles.sin_scale};
    const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (blockIdx.y == 0) {
        if (item < args.items[0]) rotate_chunk<Storage, Path, kLoadsFirst, 0>(args, angles, item);
    } else if (item < args.items[1]) {
        rotate_chunk<Storage, Path, kLoadsFirst, 1>(args, angles, item);
    }
}

/// @brief Blocks of kChunkBlockThreads along x for @p plan: enough for the operand with the most chunks.
template <typename Path>
int64_t chunk_kernel_blocks(const Plan& plan) {
    const int64_t heads = std::max(plan.q.in_geometry.heads, plan.k.in_geometry.heads);
    const int64_t items = plan.batch * plan.seq * heads * chunks_per_row<Path>(plan);
    return (items + kChunkBlockThreads - 1) / kChunkBlockThreads;
}

/// @brief Whether the chunk kernel runs @p plan: the default angle (a caller's table and
/// the precise mode keep the unit kernel, which computes or reads each cos/sin once per
/// token), enough work to fill the GPU (the bandwidth regime), and a grid that fits.
/// @tparam Path the 16-byte VectorPath (the caller checked vector_path_fits).
template <typename Path>
bool chunk_kernel_suits(const Plan& plan, const DeviceInfo& device) {
    return default_angle_only(plan.angles) &&
           bandwidth_regime(plan, chunks_per_row<Path>(plan), device, kChunkBlockThreads) &&
           chunk_kernel_blocks<Path>(plan) <= INT_MAX;
}

/// @brief Builds the chunk kernel's arguments and grid for @p plan and launches on plan.stream.
/// @pre chunk_kernel_suits<Path>(plan, device)
template <typename Storage, typename Path, int Capacity, bool kLoadsFirst = true>
void launch_chunks(const Plan& plan, const DeviceInfo& device) {
    ChunkArgs<Capacity> args{};
    args.operands[0] = plan.q;
    args.operands[1] = plan.k;
    const int64_t chunks = chunks_per_row<Path>(plan);
    for (int i = 0; i < 2; ++i) {
        const Geometry& g = args.operands[i].in_geometry;
        args.numbering[i] = RowNumbering::of(g);
        args.items[i] = g.batch * g.heads * g.seq * chunks;
    }
    args.positions = plan.positions;
    args.angles = make_angle_args<Capacity>(plan);
    args.axes = plan.axes;
    args.positions_in_memory = plan.positions.ids != nullptr || plan.positions.cu_seqlens != nullptr;
    args.rotary_dim = plan.rotary_dim;
    args.rotary_chunks = plan.pairs / Path::kPairs;
    args.by_chunks = FastDivisor(chunks);
    const int64_t blocks = chunk_kernel_blocks<Path>(plan);
    if (blocks == 0) return;
    const ProgrammaticLaunch launch(dim3(static_cast<unsigned>(blocks), args.items[1] > 0 ? 2u : 1u),
                                    dim3(kChunkBlockThreads), stream_of(plan), device);
    launch_kernel("rope_chunk_kernel", launch.config, rope_chunk_kernel<Storage, Path, Capacity, kLoadsFirst>, args);
}

}  // namespace rope::cuda_detail

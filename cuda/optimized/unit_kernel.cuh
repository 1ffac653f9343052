#pragma once
/// @file unit_kernel.cuh
/// @brief cuda-optimized's kernel and its launch (internal to the CUDA backends).
///
/// RoPE does a handful of flops per element against 4 to 16 bytes of traffic
/// (read once, written once), so its ceiling is a device-to-device copy of the
/// same bytes. Reaching it takes four things, and small calls a fifth, each
/// marked below:
///
///  1. Wide, coalesced accesses. A thread moves its *chunk* of a row, two
///     16-byte vectors (vector_layout.hpp, row_access.cuh), and neighbouring
///     threads take neighbouring chunks, so a warp reads whole 32-byte
///     sectors with a quarter of the instructions 4-byte accesses would need.
///  2. cos/sin computed once per thread, reused across heads. A thread owns
///     fixed pairs of one token; it computes their cos/sin once (accurate
///     sincosf, kept in registers) and applies them to every head row of q
///     and then of k in its *unit* (one token, a slice of its rows), so the
///     trigonometry costs a fraction of a per-element version (cuda-naive,
///     chapter 4's v4). In small calls, where a warp's units are rows of one
///     token, its lanes that hold the same chunk split those sincosf among
///     them and exchange the results (prologue.cuh, PairShare): at decode a
///     thread has a row or two, and the sincosf were most of its instructions.
///     Whatever the positions are (offset, ids, packed sequences, several axes,
///     a caller's table), they are read here, once per thread, through the
///     shared token_positions and token_rotation_factors.
///  3. Bytes in flight. DRAM answers after many hundreds of cycles; to keep
///     the memory busy each SM needs tens of kilobytes requested at once. A
///     thread loads a batch of rows before it uses the first (when the work
///     fills the GPU), or, with a software pipeline (small calls, where a
///     thread has few rows), issues the next batch's loads before it computes
///     the current one; and it issues its first loads before computing sincosf.
///  4. A grid shaped for both regimes, laid over memory in its own order.
///     Long sequences: many short-lived blocks, several waves over all SMs,
///     so the tail is short. Decode (one token, many heads): the heads are
///     split over many small blocks, so the few kilobytes are fetched by many
///     SMs at once and no thread idles. Either way the threads of a warp take
///     rows that are neighbours in memory (UnitArgs::heads_adjacent), so that
///     each step of a warp reads one contiguous stretch rather than rows
///     kilobytes apart.
///  5. A prologue that overlaps the previous kernel (programmatic dependent
///     launch, Hopper). With it, the grid starts before the previous kernel in
///     the stream has finished; everything that needs no memory (the indices,
///     and cos/sin when positions are an offset) runs then, and only the
///     memory traffic waits for the previous kernel (PreviousGrid).
///
/// Indices are int64 throughout: q tensors beyond 2^31 elements are routine
/// at long context, and 32-bit index overflow is a bug that shipped in
/// several public RoPE kernels.
///
/// What each choice gained, and the variants that lost (streaming cache
/// hints, a register cap, other batchings and shapes), is measured by the lab:
/// bench/tune.cu (rope-tune) times this kernel body under its own variants;
/// the results are in bench/results/ (h200-tune.csv and its notes).

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

/// Largest block the kernel is compiled for (its __launch_bounds__).
inline constexpr int kMaxBlockThreads = 256;

/// @brief The launch shape of one regime (4. above), which the backend picks.
struct LaunchShape {
    /// Threads per block (at most kMaxBlockThreads).
    int block_threads;
    /// Rows a thread visits per token: more rows share each sincosf and each
    /// unit's index arithmetic, fewer make more, shorter threads.
    int64_t rows_per_slice;
};

/// @brief Everything the kernel needs, passed by value (kernel_args.cuh says why).
///
/// Work decomposition: the head rows of a token (q's heads, then k's) are cut
/// into `slices` of at most `rows_per_slice` rows; a *unit* is one
/// (token, slice). Threads with the same threadIdx.y share a unit, and
/// threadIdx.x picks the chunk of the row: rotating chunks first, then
/// pass-through chunks. Consecutive units go to neighbouring threads, so the
/// numbering follows memory: with `heads_adjacent` false, units are
/// numbered slice-major (consecutive tokens of one slice, whose rows are
/// adjacent in [b, h, s, d] memory) and a slice is a run of consecutive rows;
/// with it true, token-major, and slice l of a token is rows l, l + slices,
/// l + 2 slices, ... (so that at each step a warp's units touch consecutive
/// rows of one token, adjacent in [b, s, h, d] memory).
template <int Capacity>
struct UnitArgs {
    Operand operands[2];       ///< [0] = q, [1] = k (k may have no heads).
    PositionSource positions;  ///< Offset, ids or packed sequences; perhaps a context-parallel shard.
    AngleArgs<Capacity> angles;  ///< theta_i, pair axes, scales, or a caller's table.
    int64_t axes;              ///< Position axes per token.
    bool positions_in_memory;  ///< Ids, cu_seqlens or a table: read only after the previous kernel.
    int64_t seq;
    int64_t tokens;            ///< batch * seq.
    int64_t rotary_dim;
    int64_t q_heads;           ///< Rows [0, q_heads) of a token are q's heads, the rest k's.
    int64_t rows;              ///< q heads + k heads.
    int64_t rotary_chunks;     ///< Chunks of a row that rotate.
    int64_t chunks;            ///< Rotating plus pass-through chunks (none when nothing needs copying).
    int64_t rows_per_slice;
    int64_t slices;            ///< Units per token.
    int64_t units;             ///< tokens * slices.
    bool heads_adjacent;       ///< Units numbered token-major, a slice's rows strided (bshd, thd).
    bool share_pairs;          ///< A warp of one token's units may share cos/sin (prologue.cuh, PairShare).
    FastDivisor by_seq;        ///< token -> (b, s).
    FastDivisor by_tokens;     ///< unit -> (slice, token), slice-major numbering.
    FastDivisor by_slices;     ///< unit -> (token, slice), token-major numbering.
};

/// @brief The rows of one unit: row(i) = first + i * step, for i < count.
struct RowSpan {
    int64_t first;
    int64_t step;
    int64_t count;
    __device__ int64_t row(int64_t i) const { return first + i * step; }
};

/// @brief Where the rows of one token start, in q and k, input and output: computed
/// once per unit, so that a row's address is one multiply-add away.
template <typename Storage>
struct TokenRows {
    const Storage* q_in;
    Storage* q_out;
    const Storage* k_in;
    Storage* k_out;
};

/// Head 0 of token (b, s), in every tensor.
template <typename Storage, int Capacity>
__device__ inline TokenRows<Storage> token_rows(const UnitArgs<Capacity>& args, int64_t b, int64_t s) {
    const Operand& q = args.operands[0];
    const Operand& k = args.operands[1];
    return {static_cast<const Storage*>(q.in) + q.in_geometry.offset(b, 0, s, 0),
            static_cast<Storage*>(q.out) + q.out_geometry.offset(b, 0, s, 0),
            static_cast<const Storage*>(k.in) + k.in_geometry.offset(b, 0, s, 0),
            static_cast<Storage*>(k.out) + k.out_geometry.offset(b, 0, s, 0)};
}

/// Input and output of row @p row of a token: q's head `row`, or k's head `row - q_heads`.
///
/// Written with selects on fixed fields (not operands[row >= q_heads]) so the
/// compiler reads every stride straight from the constant bank.
template <typename Storage, int Capacity>
__device__ inline RowRef<Storage> locate_row(const UnitArgs<Capacity>& args, const TokenRows<Storage>& token,
                                             int64_t row) {
    const Geometry& q_in = args.operands[0].in_geometry;
    const Geometry& q_out = args.operands[0].out_geometry;
    const Geometry& k_in = args.operands[1].in_geometry;
    const Geometry& k_out = args.operands[1].out_geometry;
    if (row < args.q_heads)
        return {token.q_in + row * q_in.stride_head, token.q_out + row * q_out.stride_head, q_in.stride_dim,
                q_out.stride_dim};
    const int64_t h = row - args.q_heads;
    return {token.k_in + h * k_in.stride_head, token.k_out + h * k_out.stride_head, k_in.stride_dim, k_out.stride_dim};
}

/// True when row @p row's operand is rotated in place (its pass-through needs no copy).
template <int Capacity>
__device__ inline bool in_place(const UnitArgs<Capacity>& args, int64_t row) {
    const Operand& operand = row < args.q_heads ? args.operands[0] : args.operands[1];
    return operand.in == operand.out;
}

/// Rotates chunk @p chunk of the rows @p rows of token (b, s).
///
/// Batches of RowsInFlight rows, loaded together before any is used. With
/// Pipelined, a software pipeline: the loads of the next batch are issued
/// before the current batch is rotated and stored, so memory requests stay in
/// flight while the thread computes (3. above). Safe in place too: a batch's
/// stores touch only its own rows. DefaultAngleOnly: see token_rotation_factors.
template <typename Storage, typename Path, int RowsInFlight, bool Pipelined, bool DefaultAngleOnly, int Capacity>
__device__ inline void rotate_rows(const UnitArgs<Capacity>& args, const TokenRows<Storage>& token, int64_t b,
                                   int64_t s, const RowSpan& rows, int64_t chunk, const PairShare& share,
                                   PreviousGrid& previous) {
    typename Path::Chunk current[RowsInFlight], next[RowsInFlight];
    // Row addresses are recomputed at the store (one multiply-add) rather than
    // kept: registers, not arithmetic, limit how many threads fit on an SM.
    auto load_batch = [&](typename Path::Chunk (&batch)[RowsInFlight], int64_t first) {
#pragma unroll
        for (int u = 0; u < RowsInFlight; ++u)
            if (first + u < rows.count)
                batch[u] = Path::load(locate_row(args, token, rows.row(first + u)), chunk, args.rotary_dim);
    };
    // cos/sin of this thread's pairs at this token, computed once (or shared across
    // the warp) and reused for every row below (2. above), around the first batch's loads (5. above).
    float cos_angle[Path::kPairs], sin_angle[Path::kPairs];
    load_with_factors<Path, DefaultAngleOnly>(args, b, s, chunk, previous, [&] { load_batch(current, 0); }, cos_angle,
                                              sin_angle, share);

    for (int64_t first = 0;; first += RowsInFlight) {
        const bool more = first + RowsInFlight < rows.count;
        if (Pipelined && more) load_batch(next, first + RowsInFlight);  // In flight while this batch is computed.
#pragma unroll
        for (int u = 0; u < RowsInFlight; ++u) {
            if (first + u < rows.count) {
                Path::rotate(current[u], cos_angle, sin_angle);
                Path::store(locate_row(args, token, rows.row(first + u)), chunk, args.rotary_dim, current[u]);
            }
        }
        if (!more) break;
        if constexpr (Pipelined) {
#pragma unroll
            for (int u = 0; u < RowsInFlight; ++u) current[u] = next[u];
        } else {
            load_batch(current, first + RowsInFlight);
        }
    }
}

/// Copies pass-through chunk @p pass_chunk of the rows @p rows of a token,
/// skipping rows rotated in place (their pass-through features already are where they belong).
template <typename Storage, typename Path, int RowsInFlight, int Capacity>
__device__ inline void copy_rows(const UnitArgs<Capacity>& args, const TokenRows<Storage>& token, const RowSpan& rows,
                                 int64_t pass_chunk, PreviousGrid& previous) {
    const int64_t feature = args.rotary_dim + pass_chunk * Path::kPassWidth;
    previous.wait();
    for (int64_t first = 0; first < rows.count; first += RowsInFlight) {
        typename Path::Pass data[RowsInFlight];
        bool copy[RowsInFlight];
#pragma unroll
        for (int u = 0; u < RowsInFlight; ++u) {
            copy[u] = first + u < rows.count && !in_place(args, rows.row(first + u));
            if (copy[u]) data[u] = Path::load_pass(locate_row(args, token, rows.row(first + u)), feature);
        }
#pragma unroll
        for (int u = 0; u < RowsInFlight; ++u)
            if (copy[u]) Path::store_pass(locate_row(args, token, rows.row(first + u)), feature, data[u]);
    }
}

/// @brief The kernel's body: each thread one chunk of one unit's rows (block: chunks x units).
///
/// A device function, so that the lab (bench/tune.cu) can compile the same
/// body into its own kernels (another Path, a register cap) beside the one
/// the backend ships, rope_unit_kernel.
template <typename Storage, typename Path, int RowsInFlight, bool Pipelined, bool DefaultAngleOnly, int Capacity>
__device__ inline void rotate_units(const UnitArgs<Capacity>& args) {
    allow_next_kernel();    // Programmatic dependent launch (5. above).
    PreviousGrid previous;  // Waited for before the first global memory access.
    const int64_t step = int64_t(gridDim.x) * blockDim.y;
    for (int64_t unit = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; unit < args.units; unit += step) {
        int64_t token;
        RowSpan rows;
        if (args.heads_adjacent) {  // Token-major: slice l of a token is rows l, l + slices, ...
            token = args.by_slices.divide(unit);
            const int64_t slice = unit - token * args.slices;
            rows = {slice, args.slices, (args.rows - slice + args.slices - 1) / args.slices};
        } else {  // Slice-major: a slice is a run of consecutive rows.
            const int64_t slice = args.by_tokens.divide(unit);
            token = unit - slice * args.tokens;
            const int64_t first = slice * args.rows_per_slice;
            rows = {first, 1, min(args.rows_per_slice, args.rows - first)};
        }
        const int64_t b = args.by_seq.divide(token);
        const int64_t s = token - b * args.seq;
        const TokenRows<Storage> token_start = token_rows<Storage>(args, b, s);
        // Only in the latency regime (Pipelined): in the bandwidth regime a thread's sincosf serve
        // 8 rows already, and the exchange's registers would cost a block per SM (occupancy, 3. above).
        PairShare share;
        if constexpr (Pipelined)
            share = warp_pair_share<Path>(args.share_pairs, unit, args.units, [&](int64_t other) {
                // Token-major, a unit's token grows with it: a warp's first and last units tell. Slice-major,
                // neighbouring units are neighbouring tokens, wrapping at the last (units 0-3 of 3 tokens
                // are tokens 0, 1, 2, 0): one token only when the call has one.
                if (args.heads_adjacent) return args.by_slices.divide(other);
                return args.tokens == 1 ? int64_t(0) : other;
            });
        for (int64_t chunk = threadIdx.x; chunk < args.chunks; chunk += blockDim.x) {
            if (chunk < args.rotary_chunks)
                rotate_rows<Storage, Path, RowsInFlight, Pipelined, DefaultAngleOnly>(args, token_start, b, s, rows,
                                                                                      chunk, share, previous);
            else
                copy_rows<Storage, Path, RowsInFlight>(args, token_start, rows, chunk - args.rotary_chunks, previous);
        }
    }
}

/// @brief The kernel the backend launches: rotate_units for one access path and batching.
///
/// __launch_bounds__ promises the compiler that no block exceeds
/// kMaxBlockThreads and that one such block per SM will do, so it caps
/// registers no further: fewer registers would mean more resident threads,
/// but this kernel then spills (the lab's sweep: a cap was slower).
/// __grid_constant__ lets device functions take references into the
/// parameters without a per-thread copy to local memory.
template <typename Storage, typename Path, int RowsInFlight, bool Pipelined, bool DefaultAngleOnly, int Capacity>
__global__ void __launch_bounds__(kMaxBlockThreads, 1)
    rope_unit_kernel(const __grid_constant__ UnitArgs<Capacity> args) {
    rotate_units<Storage, Path, RowsInFlight, Pipelined, DefaultAngleOnly>(args);
}

/// @brief True when q's rows of one token lie closer together in memory than one row's
/// neighbouring tokens (bshd, thd): units are then laid over heads (UnitArgs::heads_adjacent).
inline bool heads_adjacent_in_memory(const Plan& plan) {
    // A call with keys only (a re-rotation, rope/rerotate.hpp) is laid out by k's memory.
    const Geometry& q = plan.q.in_geometry.heads > 0 ? plan.q.in_geometry : plan.k.in_geometry;
    return q.heads > 1 && q.seq > 1 && q.stride_head < q.stride_seq;
}

/// @brief One launch of the unit kernel: its arguments and its grid.
template <int Capacity>
struct UnitLaunch {
    UnitArgs<Capacity> args{};  ///< The kernel's parameters.
    dim3 grid;                  ///< Blocks.
    dim3 block;                 ///< (chunks of a row, units) threads per block.
};

/// @brief Builds the kernel arguments and grid for @p plan in the launch shape @p shape.
/// @tparam Path VectorPath or GenericPath, for the plan's storage and style.
/// @tparam Capacity pairs the angle arguments hold (>= plan.pairs).
/// @return false when the call has no row to rotate (nothing to launch).
template <typename Path, int Capacity>
bool plan_units(const Plan& plan, const LaunchShape& shape, UnitLaunch<Capacity>& launch) {
    UnitArgs<Capacity>& args = launch.args;
    args.operands[0] = plan.q;
    args.operands[1] = plan.k;
    args.positions = plan.positions;
    args.angles = make_angle_args<Capacity>(plan);
    args.axes = plan.axes;
    args.positions_in_memory = plan.positions.ids != nullptr || plan.positions.cu_seqlens != nullptr ||
                               plan.angles.table.data != nullptr ||
                               (plan.positions.relative &&  // A re-rotation's from positions (rerotate.hpp).
                                (plan.positions.from.ids != nullptr || plan.positions.from.cu_seqlens != nullptr));
    args.seq = plan.seq;
    args.tokens = plan.batch * plan.seq;
    args.rotary_dim = plan.rotary_dim;
    args.q_heads = plan.q.in_geometry.heads;
    args.rows = plan.q.in_geometry.heads + plan.k.in_geometry.heads;
    args.rotary_chunks = plan.pairs / Path::kPairs;
    args.chunks = chunks_per_row<Path>(plan);
    if (args.tokens == 0 || args.rows == 0) return false;

    // Grid shape (4. above): block_x threads cover a row's chunks.
    const int64_t block_x = std::min<int64_t>(args.chunks, shape.block_threads);
    args.rows_per_slice = std::min(shape.rows_per_slice, args.rows);
    args.slices = (args.rows + args.rows_per_slice - 1) / args.rows_per_slice;
    args.units = args.tokens * args.slices;
    const int64_t block_y = std::max<int64_t>(1, shape.block_threads / block_x);
    // Over heads wherever q's heads are adjacent in memory, else over tokens: each step of a warp
    // then reads neighbouring rows (the lab measured both orders, forced, against this one).
    args.heads_adjacent = heads_adjacent_in_memory(plan);
    args.share_pairs = pairs_shareable<Path>(block_x, args.chunks, args.rotary_chunks);
    const int64_t blocks = (args.units + block_y - 1) / block_y;
    args.by_seq = FastDivisor(args.seq);
    args.by_tokens = FastDivisor(args.tokens);
    args.by_slices = FastDivisor(args.slices);
    launch.grid = dim3(static_cast<unsigned>(std::min<int64_t>(blocks, INT_MAX)));  // The unit loop covers the rest.
    launch.block = dim3(static_cast<unsigned>(block_x), static_cast<unsigned>(block_y));
    return true;
}

/// @brief Launches @p kernel, a kernel around rotate_units, as @p launch says, on plan.stream;
/// it may overlap the previous kernel's tail (5. above).
template <int Capacity>
void launch_unit_grid(const Plan& plan, const DeviceInfo& device, const UnitLaunch<Capacity>& launch,
                      void (*kernel)(UnitArgs<Capacity>)) {
    const ProgrammaticLaunch programmatic(launch.grid, launch.block, stream_of(plan), device);
    launch_kernel("rope_unit_kernel", programmatic.config, kernel, launch.args);
}

/// @brief Builds the kernel arguments and grid for @p plan in the launch shape @p shape and
/// launches rope_unit_kernel on plan.stream.
/// @tparam Path VectorPath or GenericPath, for the plan's storage and style.
/// @tparam RowsInFlight rows a thread loads before it uses the first (3. above).
/// @tparam Pipelined whether the next batch's loads are issued before this batch is computed.
/// @tparam Capacity pairs the angle arguments hold (>= plan.pairs).
template <typename Storage, typename Path, int RowsInFlight, bool Pipelined, int Capacity>
void launch_units(const Plan& plan, const DeviceInfo& device, const LaunchShape& shape) {
    UnitLaunch<Capacity> launch;
    if (!plan_units<Path>(plan, shape, launch)) return;
    // The default angle (no caller's table, not precise), by far the most used, gets a
    // kernel of its own: without the other two's code it needs fewer registers (see 3.).
    if (default_angle_only(plan.angles))
        launch_unit_grid(plan, device, launch,
                         rope_unit_kernel<Storage, Path, RowsInFlight, Pipelined, true, Capacity>);
    else
        launch_unit_grid(plan, device, launch,
                         rope_unit_kernel<Storage, Path, RowsInFlight, Pipelined, false, Capacity>);
}

}  // namespace rope::cuda_detail

#pragma once
/// @file optimized_kernel.cuh
/// @brief cuda-optimized's kernel and launch logic (internal to the CUDA backends).
///
/// RoPE does a handful of flops per element against 4 to 16 bytes of traffic
/// (read once, written once), so its ceiling is a device-to-device copy of the
/// same bytes. Reaching that ceiling takes four things, and small calls a fifth, each marked below:
///
///  1. Wide, coalesced accesses. A thread moves its piece of a row (a "chunk")
///     with 16-byte loads and stores, and neighbouring threads take
///     neighbouring chunks, so a warp reads whole 32-byte sectors with a
///     quarter of the instructions 4-byte accesses would need
///     (row_access.cuh: VectorPath).
///  2. cos/sin computed once, reused across heads. A thread owns fixed pairs of
///     one token; it computes their cos/sin once (accurate sincosf, kept in
///     registers) and applies them to every head row of q and then of k that
///     it visits. cuda-naive instead recomputes them for every head.
///  3. Bytes in flight. DRAM answers after about a microsecond; to keep
///     4.8 TB/s busy each SM needs tens of kilobytes requested at once. A
///     thread loads a batch of rows before it uses the first, issues the next
///     batch's loads before it computes the current one (a software
///     pipeline), and issues its first loads before it computes sincosf, so
///     that arithmetic always overlaps memory latency.
///  4. A grid shaped for both regimes. Long sequences: many short-lived
///     blocks, several waves over all SMs, so the tail is short. Decode (one
///     token, many heads): the heads are split over many small blocks, so the
///     few kilobytes are fetched by many SMs at once and no thread idles.
///  5. A prologue that overlaps the previous kernel (programmatic dependent
///     launch, Hopper). A small call is a chain of dependent steps: launch,
///     index arithmetic, sincosf, load, rotate, store. With programmatic
///     launch the grid starts before the previous kernel in the stream has
///     finished; everything that needs no memory (the indices, and cos/sin
///     when positions are an offset) runs then, and only the memory traffic
///     waits for the previous kernel (PreviousGrid).
///
/// Indices are int64 throughout: q tensors beyond 2^31 elements are routine
/// at long context, and 32-bit index overflow is a bug that shipped in
/// several public RoPE kernels.
///
/// The backend (optimized_backend.cu) launches this with LaunchTuning's
/// defaults; rope-cuda-self-check --tune times other settings against them.

#include <algorithm>
#include <climits>
#include <cstdint>

#include "check.hpp"
#include "fast_divisor.cuh"
#include "kernel_args.cuh"
#include "rope/detail/pair_step.hpp"
#include "row_access.cuh"

namespace rope::cuda_detail {

/// Largest block the kernel is compiled for (its __launch_bounds__).
inline constexpr int kMaxBlockThreads = 256;

/// @brief The launch-shape choices of cuda-optimized (see 4. above); defaults are the backend's,
/// chosen with rope-cuda-self-check --tune on the H200.
struct LaunchTuning {
    /// Threads per block when the work fills the GPU (at most kMaxBlockThreads).
    /// Blocks of 128 measured 1-2% faster than 256: finer blocks shorten the tail.
    int block_threads = 128;
    /// Threads per block below one wave of work: small blocks spread a small problem over more SMs.
    int small_block_threads = 128;
    /// Head rows a thread visits per token in the bandwidth regime (0: the
    /// access path's kMaxRowsPerSlice): more rows share each sincosf and each
    /// unit's index arithmetic, fewer give more, shorter-lived threads.
    int64_t max_rows_per_slice = 0;
    /// Rows per thread below one wave of work. Measured on the H200 for decode
    /// [1,32,1,128] (0.93 us against 0.97 with 1 row) and [4,8,256,64]: with
    /// the prologue overlapping the previous kernel (5. above), the second row
    /// costs less than the extra threads.
    int64_t small_rows_per_slice = 2;
    /// Rows per thread regardless of the rules above (0: automatic); for --tune.
    int64_t force_rows_per_slice = 0;
    /// Order of units: true = slice-major (a block's threads take neighbouring
    /// tokens of the same heads: adjacent rows in bhsd memory, 2-3% faster
    /// there), false = token-major (a block's threads walk the heads of few tokens).
    bool slice_major = true;
    /// Use programmatic dependent launch where the device has it (compute capability >= 9.0).
    bool programmatic_launch = true;

};

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

/// @brief Everything the kernel needs, passed by value (kernel_args.cuh says why).
///
/// Work decomposition: the head rows of a token (q's heads, then k's) are cut
/// into `slices` of `rows_per_slice` consecutive rows; a *unit* is one
/// (token, slice). Threads with the same threadIdx.y share a unit, and
/// threadIdx.x picks the chunk of the row: rotating chunks first, then
/// pass-through chunks.
template <int Capacity>
struct OptimizedArgs {
    Operand operands[2];       ///< [0] = q, [1] = k (k may have no heads).
    PositionSource positions;  ///< Offset, or device-resident ids.
    AngleArgs<Capacity> angles;
    int64_t axes;              ///< Position axes per token.
    Style style;
    bool slice_major;          ///< LaunchTuning::slice_major.
    int64_t seq;
    int64_t tokens;            ///< batch * seq.
    int64_t rotary_dim;
    int64_t q_heads;           ///< Rows [0, q_heads) of a token are q's heads, the rest k's.
    int64_t rows;              ///< q heads + k heads.
    int64_t rotary_chunks;     ///< Chunks of a row that rotate.
    int64_t chunks;            ///< Rotating plus pass-through chunks (none when nothing needs copying).
    int64_t rows_per_slice;
    int64_t slices;
    int64_t units;             ///< tokens * slices.
    FastDivisor by_seq;        ///< token -> (b, s).
    FastDivisor by_slices;     ///< unit -> (token, slice), token-major.
    FastDivisor by_tokens;     ///< unit -> (slice, token), slice-major.
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
__device__ inline TokenRows<Storage> token_rows(const OptimizedArgs<Capacity>& args, int64_t b, int64_t s) {
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
__device__ inline RowRef<Storage> locate_row(const OptimizedArgs<Capacity>& args, const TokenRows<Storage>& token,
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
__device__ inline bool in_place(const OptimizedArgs<Capacity>& args, int64_t row) {
    const Operand& operand = args.operands[row < args.q_heads ? 0 : 1];
    return operand.in == operand.out;
}

/// @brief Waits, once per thread, until the previous kernel in the stream has
/// finished and its writes are visible (programmatic dependent launch, 5. above).
///
/// Every global memory access of the kernel comes after a call to this; what
/// comes before (index arithmetic, cos/sin of offset positions) overlaps the
/// previous kernel's tail. Without programmatic launch the wait returns at once.
struct PreviousGrid {
    bool done = false;
    __device__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (!done) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
        done = true;
    }
};

/// Rotates chunk @p chunk of rows [row_begin, row_end) of token (b, s).
///
/// Batches of RowsInFlight rows, loaded together before any is used. With
/// Path::kPipelined, a software pipeline: the loads of the next batch are
/// issued before the current batch is rotated and stored, so memory requests
/// stay in flight while the thread computes (3. above). Safe in place too: a
/// batch's stores touch only its own rows.
template <typename Storage, typename Path, int RowsInFlight, int Capacity>
__device__ inline void rotate_rows(const OptimizedArgs<Capacity>& args, const TokenRows<Storage>& token,
                                   int64_t position_b, int64_t position_s, int64_t row_begin, int64_t row_end,
                                   int64_t chunk, PreviousGrid& previous) {
    typename Path::Pairs current[RowsInFlight], next[RowsInFlight];
    // Row addresses are recomputed at the store (one multiply-add) rather than
    // kept: registers, not arithmetic, limit how many threads fit on an SM.
    auto load_batch = [&](typename Path::Pairs (&batch)[RowsInFlight], int64_t first) {
#pragma unroll
        for (int u = 0; u < RowsInFlight; ++u)
            if (first + u < row_end) batch[u] = Path::load(locate_row(args, token, first + u), chunk, args.style, args.rotary_dim);
    };
    // cos/sin of this thread's pairs at this token, computed once and reused
    // for every row below (2. above). Positions given as an offset need no
    // memory: compute them before waiting for the previous kernel (5. above).
    // Position ids live in memory, written perhaps by that very kernel: wait,
    // issue the first loads, and compute while they are in flight.
    float cos_angle[Path::kPairs], sin_angle[Path::kPairs];
    auto compute_factors = [&] {
        const TokenPositions positions = token_positions(args.positions, args.axes, position_b, position_s);
#pragma unroll
        for (int p = 0; p < Path::kPairs; ++p) {
            const int64_t pair = Path::pair_of(chunk, p, args.rotary_dim);
            rotation_factors(args.angles, positions.of_axis(args.angles.pair_axis[pair]), pair, cos_angle[p], sin_angle[p]);
        }
    };
    const bool from_memory = args.positions.ids != nullptr || args.positions.cu_seqlens != nullptr ||
                             args.angles.table.data != nullptr;
    if (!from_memory) {
        compute_factors();
        previous.wait();
        load_batch(current, row_begin);
    } else {
        previous.wait();
        load_batch(current, row_begin);
        compute_factors();
    }

    for (int64_t first = row_begin;; first += RowsInFlight) {
        const bool more = first + RowsInFlight < row_end;
        if (Path::kPipelined && more) load_batch(next, first + RowsInFlight);  // In flight while this batch is computed.
#pragma unroll
        for (int u = 0; u < RowsInFlight; ++u) {
            if (first + u < row_end) {
                Path::rotate(current[u], cos_angle, sin_angle);
                Path::store(locate_row(args, token, first + u), chunk, args.style, args.rotary_dim, current[u]);
            }
        }
        if (!more) break;
        if constexpr (Path::kPipelined) {
#pragma unroll
            for (int u = 0; u < RowsInFlight; ++u) current[u] = next[u];
        } else {
            load_batch(current, first + RowsInFlight);
        }
    }
}

/// Copies pass-through chunk @p pass_chunk of rows [row_begin, row_end) of token (b, s),
/// skipping rows rotated in place (their pass-through features already are where they belong).
template <typename Storage, typename Path, int RowsInFlight, int Capacity>
__device__ inline void copy_rows(const OptimizedArgs<Capacity>& args, const TokenRows<Storage>& token,
                                 int64_t row_begin, int64_t row_end, int64_t pass_chunk, PreviousGrid& previous) {
    const int64_t feature = args.rotary_dim + pass_chunk * Path::kPassElements;
    previous.wait();
    for (int64_t first = row_begin; first < row_end; first += RowsInFlight) {
        decltype(Path::load_pass(RowRef<Storage>{}, 0)) data[RowsInFlight];
        RowRef<Storage> rows[RowsInFlight];
        bool copy[RowsInFlight];
#pragma unroll
        for (int u = 0; u < RowsInFlight; ++u) {
            copy[u] = first + u < row_end && !in_place(args, first + u);
            if (copy[u]) {
                rows[u] = locate_row(args, token, first + u);
                data[u] = Path::load_pass(rows[u], feature);
            }
        }
#pragma unroll
        for (int u = 0; u < RowsInFlight; ++u)
            if (copy[u]) Path::store_pass(rows[u], feature, data[u]);
    }
}

/// @brief The kernel: block (chunks, units); each thread one chunk of one unit's rows.
///
/// __launch_bounds__ promises the compiler that no block exceeds
/// kMaxBlockThreads and, with MinBlocksPerSM > 1, asks it to fit that many
/// such blocks per SM, capping registers (4 blocks: 64 registers a thread).
/// Fewer registers mean more resident threads, hence more bytes in flight, as
/// long as nothing spills. __grid_constant__ lets device functions take
/// references into the parameters without a per-thread copy to local memory.
template <typename Storage, typename Path, int RowsInFlight, int Capacity, int MinBlocksPerSM>
__global__ void __launch_bounds__(kMaxBlockThreads, MinBlocksPerSM)
    rope_optimized_kernel(const __grid_constant__ OptimizedArgs<Capacity> args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Programmatic dependent launch (Hopper, 5. above): this grid may have been
    // started while the previous kernel in the stream was still finishing. Let
    // the next kernel start early in turn (all our blocks are resident by the
    // time every block has run this).
    asm volatile("griddepcontrol.launch_dependents;");
#endif
    PreviousGrid previous;  // Waited for before the first global memory access.
    const int64_t step = int64_t(gridDim.x) * blockDim.y;
    for (int64_t unit = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; unit < args.units; unit += step) {
        int64_t token, slice;
        if (args.slice_major) {
            slice = args.by_tokens.divide(unit);
            token = unit - slice * args.tokens;
        } else {
            token = args.by_slices.divide(unit);
            slice = unit - token * args.slices;
        }
        const int64_t b = args.by_seq.divide(token);
        const int64_t s = token - b * args.seq;
        const int64_t row_begin = slice * args.rows_per_slice;
        const int64_t row_end = row_begin + args.rows_per_slice < args.rows ? row_begin + args.rows_per_slice : args.rows;
        const TokenRows<Storage> token_start = token_rows<Storage>(args, b, s);
        for (int64_t chunk = threadIdx.x; chunk < args.chunks; chunk += blockDim.x) {
            if (chunk < args.rotary_chunks)
                rotate_rows<Storage, Path, RowsInFlight>(args, token_start, b, s, row_begin, row_end, chunk, previous);
            else
                copy_rows<Storage, Path, RowsInFlight>(args, token_start, row_begin, row_end, chunk - args.rotary_chunks,
                                                       previous);
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
template <typename Storage, Style kStyle>
bool vector_path_fits(const Plan& plan) {
    if (!VectorPath<Storage, kStyle>::fits(plan.rotary_dim, plan.head_dim)) return false;
    for (const Operand* operand : {&plan.q, &plan.k}) {
        if (operand->in_geometry.heads == 0) continue;
        if (!rows_vectorizable<Storage>(operand->in, operand->in_geometry)) return false;
        if (!rows_vectorizable<Storage>(operand->out, operand->out_geometry)) return false;
    }
    return true;
}

/// Largest power of two <= @p value, for value >= 1.
inline int64_t floor_power_of_two(int64_t value) {
    int64_t power = 1;
    while (power * 2 <= value) power *= 2;
    return power;
}

/// @brief Chunks per row for @p Path: rotating ones, plus pass-through ones when any
/// operand has a separate output (in place, pass-through features are already where they belong).
template <typename Path>
int64_t chunks_per_row(const Plan& plan) {
    const bool copy_needed = (plan.q.in_geometry.heads > 0 && plan.q.in != plan.q.out) ||
                             (plan.k.in_geometry.heads > 0 && plan.k.in != plan.k.out);
    const int64_t pass_chunks = copy_needed ? (plan.head_dim - plan.rotary_dim) / Path::kPassElements : 0;
    return plan.pairs / Path::kPairs + pass_chunks;
}

/// @brief True when one row per thread already makes at least a full wave of
/// threads: the bandwidth regime (else the latency regime, see 4. above).
inline bool bandwidth_bound(const Plan& plan, int64_t chunks, const DeviceInfo& device, const LaunchTuning& tuning) {
    const int64_t block_x = std::min<int64_t>(chunks, tuning.block_threads);
    const int64_t thread_rows = plan.batch * plan.seq * (plan.q.in_geometry.heads + plan.k.in_geometry.heads) * block_x;
    return thread_rows >= int64_t(device.multiprocessors) * 2048;  // 2048: thread slots of an SM.
}

/// @brief Builds the kernel arguments and grid for @p plan and launches on plan.stream.
template <typename Storage, typename Path, int RowsInFlight, int Capacity, int MinBlocksPerSM>
void launch_optimized(const Plan& plan, const DeviceInfo& device, const LaunchTuning& tuning) {
    OptimizedArgs<Capacity> args{};
    args.operands[0] = plan.q;
    args.operands[1] = plan.k;
    args.positions = plan.positions;
    args.angles = make_angle_args<Capacity>(plan);
    args.axes = plan.axes;
    args.style = plan.style;
    args.slice_major = tuning.slice_major;
    args.seq = plan.seq;
    args.tokens = plan.batch * plan.seq;
    args.rotary_dim = plan.rotary_dim;
    args.q_heads = plan.q.in_geometry.heads;
    args.rows = plan.q.in_geometry.heads + plan.k.in_geometry.heads;
    args.rotary_chunks = plan.pairs / Path::kPairs;
    args.chunks = chunks_per_row<Path>(plan);
    if (args.tokens == 0 || args.rows == 0) return;

    // Grid shape (4. above): block_x threads cover a row's chunks.
    const int64_t block_x = std::min<int64_t>(args.chunks, tuning.block_threads);
    // Bandwidth regime: each thread visits the access path's kMaxRowsPerSlice
    // rows per token (measured best: more rows share each unit's sincosf and
    // index arithmetic). Latency regime: few rows per thread and small blocks,
    // so many SMs each fetch a few kilobytes.
    const bool bandwidth = bandwidth_bound(plan, args.chunks, device, tuning);
    if (tuning.force_rows_per_slice > 0)
        args.rows_per_slice = tuning.force_rows_per_slice;
    else if (bandwidth)
        args.rows_per_slice = tuning.max_rows_per_slice > 0 ? tuning.max_rows_per_slice : Path::kMaxRowsPerSlice;
    else
        args.rows_per_slice = tuning.small_rows_per_slice;
    args.rows_per_slice = std::min(args.rows_per_slice, args.rows);
    args.slices = (args.rows + args.rows_per_slice - 1) / args.rows_per_slice;
    args.units = args.tokens * args.slices;
    const int threads = bandwidth ? tuning.block_threads : tuning.small_block_threads;
    const int64_t block_y = std::max<int64_t>(1, threads / block_x);
    const int64_t blocks = (args.units + block_y - 1) / block_y;
    args.by_seq = FastDivisor(args.seq);
    args.by_slices = FastDivisor(args.slices);
    args.by_tokens = FastDivisor(args.tokens);

    cudaLaunchConfig_t config = launch_config(dim3(static_cast<unsigned>(std::min<int64_t>(blocks, INT_MAX))),  // The unit loop covers the rest.
                                              dim3(static_cast<unsigned>(block_x), static_cast<unsigned>(block_y)),
                                              stream_of(plan));
    // See the kernel's griddepcontrol: the launch may overlap the previous kernel's tail.
    cudaLaunchAttribute programmatic{};
    programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    programmatic.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &programmatic;
    config.numAttrs = device.programmatic_launch && tuning.programmatic_launch ? 1 : 0;
    launch_kernel("rope_optimized_kernel", config, rope_optimized_kernel<Storage, Path, RowsInFlight, Capacity, MinBlocksPerSM>,
                  args);
}

}  // namespace rope::cuda_detail

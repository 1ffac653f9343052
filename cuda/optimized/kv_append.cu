// cuda-optimized's RoPE + KV append: the whole decode step of a serving engine
// in one launch. kv_append.cuh says what it does; unit_kernel.cuh explains the
// recipe this kernel follows, whose points (1. to 5.) are cited below.
//
// Why fused: at decode the call moves a few hundred kilobytes, and two
// launches (RoPE, then a cache write) pay two launch latencies and read the
// rotated k back from memory. One launch reads q, k and v once and writes
// q_out, k_out and both cache rows from registers.
//
// Work decomposition. A token has `rows` rotating rows (q's heads, then k's)
// and k_heads v rows. Each kind is cut into slices of at most kAppendRows
// rows: rotating slice l takes rows l, l + rotating_slices, ..., v slice l
// the v rows l, l + v_slices, ... A unit is one (token, slice), numbered
// token-major (rotating slices first), so that the threads of a warp take
// neighbouring rows of one token, adjacent in [T, H, D] memory (4.). Threads
// with the same threadIdx.y share a unit; threadIdx.x picks the chunk of a
// row: first the rotating chunks, two 16-byte runs each (1.,
// vector_layout.hpp), then the pass-through runs of partial rotary; in the v
// rows, thread x copies runs x, x + blockDim.x, ... A thread issues the loads
// of all its rows before it uses the first (3.), and computes the cos/sin of
// its chunk once for all of them (2.). When the call cannot fill the GPU a
// slice is two rows, and one when it fills less than a quarter of it: more
// threads, each with less to do, finish a decode step sooner; there a warp
// whose units are rotating slices of one token splits those cos/sin among its
// lanes (prologue.cuh's PairShare), since a thread's one or two rows no longer
// pay for their sincosf.
//
// The caches' type is a template parameter (model dtype, e4m3fn or e5m2, the same
// for k and v), so that each kernel carries the code of one store only: unrolled
// over four rows, a conversion that is a runtime choice put the code of every
// choice in one kernel, twice the instruction cache's size, and at prefill its
// warps waited on instruction fetch more than on memory (Nsight Compute's
// no-instruction stall, bench/results/notes/serving-forms.md). A call whose k
// and v caches differ in type takes the generic kernel (kv_append_generic.cu).
//
// The rotated k row reaches the k cache from registers: a model-dtype cache
// receives exactly the bits written to k_out; an FP8 cache receives
// quantize_fp8 of the float32 rotated value, never first rounded to the model
// dtype, computed by Fp8Quantizer (rope/fp8.hpp): the same codes, with the
// division by the row's scale set up once per row instead of once per value,
// which kept a dozen instructions and a slow-path branch beside every element
// written. An FP8 q output in the caches' format takes q's rows the same way,
// each with its own scale, and q_out is not written; one in another format
// takes the generic kernel. The angle is the token's position, never its slot. A
// slot outside [0, slot_limit) writes nothing: padding, or a device slot that
// validation could not read. All offsets are int64.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "check.hpp"
#include "device_launch.cuh"
#include "fast_divisor.cuh"
#include "kernel_args.cuh"
#include "kv_append.cuh"
#include "kv_append_generic.hpp"
#include "pointer_check.hpp"
#include "prologue.cuh"
#include "rope/detail/pair_step.hpp"
#include "rope/fp8.hpp"
#include "rope/rotation.hpp"
#include "row_access.cuh"

namespace rope::cuda_detail {
namespace {

/// Threads per block, as the RoPE kernel's (backend.cu says why small blocks).
constexpr int kAppendBlockThreads = 128;
/// Blocks an SM holds at least, which bounds a thread's registers: 96 for the lean kernels
/// (default angle), which keeps more loads in flight at prefill without spilling; 128 for the
/// others, which would spill at 96, and for the small-call kernels into FP8 caches (kSharePairs),
/// whose shared cos/sin beside the quantizers would: a decode step has blocks to spare.
template <bool kDefaultAngleOnly, CacheDType kCache, bool kSharePairs>
constexpr int kAppendMinBlocks = kDefaultAngleOnly && (kCache == CacheDType::model || !kSharePairs) ? 5 : 4;
/// Rows a thread takes in one unit at most, whose loads it issues before it uses the first (3.):
/// four into model-dtype caches; two into FP8 ones, where four rows' float32 values and their
/// quantizers need more registers than kAppendMinBlocks allows (at 96 they spill; at 128, four rows
/// made the prefill slower than two: bench/results/notes/serving-forms.md, the tenth run).
template <CacheDType kCache>
constexpr int kAppendRows = kCache == CacheDType::model ? 4 : 2;
/// The same in the kernels for calls that do not fill the GPU (kSharePairs), whose slices are one
/// or two rows (launch_append): room for two only leaves their registers to the shared cos/sin.
constexpr int kSmallCallRows = 2;
/// Angle-argument capacity for rotary_dim <= 128 (backend.cu's kSmallCapacity, for the same reason).
constexpr int kSmallAppendCapacity = 64;

/// Everything the kernel needs, by value (kernel_args.cuh says why).
template <int Capacity>
struct AppendArgs {
    Operand q;                   ///< Queries: rotated into q.out.
    Operand k;                   ///< Keys: rotated into k.out and the k cache.
    const void* v;               ///< Values: copied into the v cache.
    Geometry v_geometry;         ///< Sizes and strides of v (batch 1, seq = tokens).
    PositionSource positions;    ///< Each token's position: the angle.
    AngleArgs<Capacity> angles;  ///< theta_i, pair axes, scales, or a caller's table.
    int64_t axes;                ///< Position axes per token.
    bool positions_in_memory;    ///< Ids, cu_seqlens or a table: read only after the previous kernel.
    int64_t rotary_dim;
    int64_t q_heads;             ///< Rows [0, q_heads) of a token are q's heads, the rest k's.
    int64_t k_heads;             ///< k's heads, and v's.
    int64_t rows;                ///< q_heads + k_heads.
    int64_t rotary_chunks;       ///< Chunks of a row that rotate.
    int64_t chunks;              ///< Rotating chunks plus pass-through runs.
    int64_t v_runs;              ///< 16-byte runs of a v row.
    int64_t rotating_slices;     ///< Units per token that rotate (q's and k's rows).
    int64_t v_slices;            ///< Units per token that copy v's rows.
    int64_t slices;              ///< rotating_slices + v_slices.
    int64_t units;               ///< tokens * slices.
    FastDivisor by_slices;       ///< unit -> (token, slice).
    FastDivisor by_page_size;    ///< slot -> (page, slot in page).
    const int64_t* slots;        ///< Slot of each of the first slot_count tokens.
    int64_t slot_count;
    int64_t slot_limit;          ///< pages * page_size.
    CacheTarget k_cache;
    CacheTarget v_cache;
    CacheTarget q_fp8;           ///< q's FP8 output, in the caches' format (data null: q goes to q_out).
};

/// Where token's rows go in each cache: feature 0 of head 0 of its slot, or slot -1 (nothing written).
struct SlotRows {
    int64_t slot;
    int64_t k_row;
    int64_t v_row;
};

template <int Capacity>
__device__ inline SlotRows slot_rows(const AppendArgs<Capacity>& args, int64_t raw_slot) {
    if (raw_slot < 0 || raw_slot >= args.slot_limit) return {-1, 0, 0};
    const int64_t page = args.by_page_size.divide(raw_slot);
    const int64_t in_page = raw_slot - page * args.by_page_size.divisor;
    return {raw_slot, page * args.k_cache.stride_page + in_page * args.k_cache.stride_slot,
            page * args.v_cache.stride_page + in_page * args.v_cache.stride_slot};
}

/// Input row @p row of a token: q's head `row`, or k's head `row - q_heads`.
template <typename Storage, int Capacity>
__device__ inline const Storage* row_in(const AppendArgs<Capacity>& args, int64_t token, int64_t row) {
    return row < args.q_heads
               ? static_cast<const Storage*>(args.q.in) + args.q.in_geometry.offset(0, row, token, 0)
               : static_cast<const Storage*>(args.k.in) + args.k.in_geometry.offset(0, row - args.q_heads, token, 0);
}

/// Output row @p row of a token (q_out or k_out).
template <typename Storage, int Capacity>
__device__ inline Storage* row_out(const AppendArgs<Capacity>& args, int64_t token, int64_t row) {
    return row < args.q_heads
               ? static_cast<Storage*>(args.q.out) + args.q.out_geometry.offset(0, row, token, 0)
               : static_cast<Storage*>(args.k.out) + args.k.out_geometry.offset(0, row - args.q_heads, token, 0);
}

/// The dequantisation scale of head @p head (read only for an FP8 cache).
template <CacheDType kCache>
__device__ inline float cache_scale(const CacheTarget& cache, int64_t head) {
    return kCache == CacheDType::model ? 1.0f : cache.scale_of(head);
}

/// Whether q's rotation goes to its FP8 output (only ever in the caches' FP8 format:
/// append_vector_fits sends other calls to the generic kernel), instead of q_out.
template <CacheDType kCache, int Capacity>
__device__ inline bool q_quantised(const AppendArgs<Capacity>& args) {
    return kCache != CacheDType::model && args.q_fp8.data != nullptr;
}

/// What quantises a row's values into a cache of type kCache: the Fp8Quantizer of the
/// row's scale (rope/fp8.hpp: the codes of quantize_fp8 without a division per value),
/// set up once per row; nothing for a model-dtype cache.
template <CacheDType kCache>
struct QuantizerOf {
    struct type {
        __device__ explicit type(float) {}
    };
};
template <>
struct QuantizerOf<CacheDType::e4m3fn> {
    using type = Fp8Quantizer<Fp8Format::e4m3fn>;
};
template <>
struct QuantizerOf<CacheDType::e5m2> {
    using type = Fp8Quantizer<Fp8Format::e5m2>;
};
template <CacheDType kCache>
using Quantizer = typename QuantizerOf<kCache>::type;

/// Rotates the pairs of a chunk's two runs in float32; the result stays in
/// float32, in feature order, for k_out (rounded) and an FP8 cache (quantised).
/// The pairs of slot p are those of VectorPath::rotate (vector_layout.hpp).
template <typename Storage, Style kStyle>
__device__ inline void rotate_runs(const Vector16<Storage> (&in)[2],
                                   const float (&cos_angle)[Vector16<Storage>::kWidth],
                                   const float (&sin_angle)[Vector16<Storage>::kWidth],
                                   float (&value)[2][Vector16<Storage>::kWidth]) {
    constexpr int kWidth = Vector16<Storage>::kWidth;
#pragma unroll
    for (int run = 0; run < 2; ++run)
#pragma unroll
        for (int i = 0; i < kWidth; ++i) value[run][i] = to_float(in[run].value[i]);
#pragma unroll
    for (int p = 0; p < kWidth; ++p) {
        if constexpr (kStyle == Style::half_split) {
            rotate_pair(value[0][p], value[1][p], cos_angle[p], sin_angle[p]);
        } else {
            constexpr int kHalf = kWidth / 2;
            const int run = p < kHalf ? 0 : 1;
            const int at = 2 * (p % kHalf);
            rotate_pair(value[run][at], value[run][at + 1], cos_angle[p], sin_angle[p]);
        }
    }
}

/// Rounds a run of float32 values to the model dtype.
template <typename Storage>
__device__ inline Vector16<Storage> round_run(const float (&value)[Vector16<Storage>::kWidth]) {
    Vector16<Storage> run;
#pragma unroll
    for (int i = 0; i < Vector16<Storage>::kWidth; ++i) run.value[i] = from_float<Storage>(value[i]);
    return run;
}

/// Writes a run of FP8 codes of @p value (4 or 8 bytes: one store).
template <CacheDType kCache, int kWidth>
__device__ inline void store_fp8_run(const CacheTarget& cache, int64_t offset, const Quantizer<kCache>& quantizer,
                                     const float (&value)[kWidth]) {
    static_assert(kWidth == 4 || kWidth == 8, "a 16-byte run holds 4 fp32 or 8 fp16/bf16 values");
    uint32_t word[kWidth / 4];
#pragma unroll
    for (int i = 0; i < kWidth / 4; ++i) word[i] = quantizer.quantize4(value + 4 * i);
    uint8_t* target = static_cast<uint8_t*>(cache.data) + offset;
    if constexpr (kWidth == 8)
        *reinterpret_cast<uint2*>(target) = make_uint2(word[0], word[1]);
    else
        *reinterpret_cast<uint32_t*>(target) = word[0];
}

/// Writes a rotated run into a cache: @p stored (the bits of k_out) into a
/// model-dtype cache, FP8 codes of @p value (float32) into an FP8 one.
/// @tparam kCache the caches' type.
template <CacheDType kCache, typename Storage>
__device__ inline void store_cache_run(const CacheTarget& cache, int64_t offset, const Quantizer<kCache>& quantizer,
                                       const Vector16<Storage>& stored,
                                       const float (&value)[Vector16<Storage>::kWidth]) {
    if constexpr (kCache == CacheDType::model)
        store16(static_cast<Storage*>(cache.data) + offset, stored);
    else
        store_fp8_run<kCache>(cache, offset, quantizer, value);
}

/// Writes a copied run (v, or pass-through features) into a cache.
template <CacheDType kCache, typename Storage>
__device__ inline void store_cache_copy(const CacheTarget& cache, int64_t offset, const Quantizer<kCache>& quantizer,
                                        const Vector16<Storage>& stored) {
    if constexpr (kCache == CacheDType::model) {
        store16(static_cast<Storage*>(cache.data) + offset, stored);
    } else {
        float value[Vector16<Storage>::kWidth];
#pragma unroll
        for (int i = 0; i < Vector16<Storage>::kWidth; ++i) value[i] = to_float(stored.value[i]);
        store_fp8_run<kCache>(cache, offset, quantizer, value);
    }
}

/// The token's slot, read once per unit after the wait for the previous kernel.
template <int Capacity>
__device__ inline int64_t read_slot(const AppendArgs<Capacity>& args, int64_t token, PreviousGrid& previous) {
    previous.wait();
    return token < args.slot_count ? args.slots[token] : -1;
}

/// Rotating slice @p slice of @p token: this thread's chunk of each of its rows into
/// q_out or k_out, and k's rows into the k cache too.
template <typename Storage, Style kStyle, bool kDefaultAngleOnly, CacheDType kCache, int kRows, int Capacity>
__device__ inline void rotate_slice(const AppendArgs<Capacity>& args, int64_t token, int64_t slice,
                                    const PairShare& share, PreviousGrid& previous) {
    using Path = VectorPath<Storage, kStyle>;  // Which pairs a chunk holds; its cos/sin (prologue.cuh).
    constexpr int kWidth = Path::kWidth;
    const int64_t count = (args.rows - slice + args.rotating_slices - 1) / args.rotating_slices;  // <= kRows
    auto row_of = [&](int u) { return slice + u * args.rotating_slices; };
    for (int64_t chunk = threadIdx.x; chunk < args.chunks; chunk += blockDim.x) {
        int64_t raw_slot = -1;
        if (chunk < args.rotary_chunks) {
            const int64_t first_feature = chunk * kWidth;
            const int64_t second_feature = args.rotary_dim / 2 + chunk * kWidth;
            Vector16<Storage> batch[kRows][2];
            float scale[kRows];  // k rows' FP8 scales, loaded with the rows: no second round trip.
            float cos_angle[kWidth], sin_angle[kWidth];
            load_with_factors<Path, kDefaultAngleOnly>(
                args, 0, token, chunk, previous,
                [&] {
#pragma unroll
                    for (int u = 0; u < kRows; ++u) {
                        if (u < count) {
                            const Storage* in = row_in<Storage>(args, token, row_of(u));
                            batch[u][0] = load16(in + first_feature);
                            batch[u][1] = load16(in + second_feature);
                            const int64_t head = row_of(u) - args.q_heads;
                            scale[u] = head >= 0 ? cache_scale<kCache>(args.k_cache, head)
                                       : q_quantised<kCache>(args) ? cache_scale<kCache>(args.q_fp8, row_of(u))
                                                                   : 1.0f;
                        }
                    }
                    raw_slot = read_slot(args, token, previous);
                },
                cos_angle, sin_angle, share);
            const SlotRows target = slot_rows(args, raw_slot);
#pragma unroll
            for (int u = 0; u < kRows; ++u) {
                if (u >= count) continue;
                const int64_t row = row_of(u);
                float value[2][kWidth];
                rotate_runs<Storage, kStyle>(batch[u], cos_angle, sin_angle, value);
                if (row < args.q_heads && q_quantised<kCache>(args)) {  // q_out is not written.
                    const int64_t q_row = args.q_fp8.row_offset(token, 1, row);
                    const Quantizer<kCache> quantizer(scale[u]);
                    store_cache_run<kCache>(args.q_fp8, q_row + first_feature, quantizer, Vector16<Storage>{}, value[0]);
                    store_cache_run<kCache>(args.q_fp8, q_row + second_feature, quantizer, Vector16<Storage>{}, value[1]);
                    continue;
                }
                const Vector16<Storage> stored[2] = {round_run<Storage>(value[0]), round_run<Storage>(value[1])};
                Storage* out = row_out<Storage>(args, token, row);
                store16(out + first_feature, stored[0]);  // q_out, or the live k: always written.
                store16(out + second_feature, stored[1]);
                if (row < args.q_heads || target.slot < 0) continue;
                const int64_t head = row - args.q_heads;
                const int64_t cache_row = target.k_row + head * args.k_cache.stride_head;
                const Quantizer<kCache> quantizer(scale[u]);
                store_cache_run<kCache>(args.k_cache, cache_row + first_feature, quantizer, stored[0], value[0]);
                store_cache_run<kCache>(args.k_cache, cache_row + second_feature, quantizer, stored[1], value[1]);
            }
        } else {  // Partial rotary: a run of pass-through features, copied to the output and the cache.
            const int64_t feature = args.rotary_dim + (chunk - args.rotary_chunks) * kWidth;
            raw_slot = read_slot(args, token, previous);
            const SlotRows target = slot_rows(args, raw_slot);
            for (int u = 0; u < count; ++u) {
                const int64_t row = row_of(u);
                const bool is_q = row < args.q_heads;
                if (is_q && q_quantised<kCache>(args)) {  // Into q's FP8 output only.
                    const Vector16<Storage> data = load16(row_in<Storage>(args, token, row) + feature);
                    store_cache_copy<kCache>(args.q_fp8, args.q_fp8.row_offset(token, 1, row) + feature,
                                             Quantizer<kCache>(cache_scale<kCache>(args.q_fp8, row)), data);
                    continue;
                }
                const bool copy_out = is_q ? args.q.in != args.q.out : args.k.in != args.k.out;
                const bool cached = !is_q && target.slot >= 0;
                if (!copy_out && !cached) continue;
                const Vector16<Storage> data = load16(row_in<Storage>(args, token, row) + feature);
                if (copy_out) store16(row_out<Storage>(args, token, row) + feature, data);
                if (!cached) continue;
                const int64_t head = row - args.q_heads;
                store_cache_copy<kCache>(args.k_cache, target.k_row + head * args.k_cache.stride_head + feature,
                                         Quantizer<kCache>(cache_scale<kCache>(args.k_cache, head)), data);
            }
        }
    }
}

/// V slice @p slice of @p token: this thread's runs of each of its v rows, unrotated, into
/// the v cache; padding writes nothing. Two runs a row at a time, all rows' loads first.
template <typename Storage, CacheDType kCache, int kRows, int Capacity>
__device__ inline void copy_v_slice(const AppendArgs<Capacity>& args, int64_t token, int64_t slice,
                                    PreviousGrid& previous) {
    constexpr int kWidth = Vector16<Storage>::kWidth;
    const int64_t count = (args.k_heads - slice + args.v_slices - 1) / args.v_slices;  // <= kRows
    auto head_of = [&](int u) { return slice + u * args.v_slices; };
    const int64_t runs_per_pass = 2 * int64_t(blockDim.x);
    for (int64_t first = threadIdx.x; first < args.v_runs; first += runs_per_pass) {
        previous.wait();
        Vector16<Storage> data[kRows][2];
        float scale[kRows];  // Loaded with the rows, as in rotate_slice.
#pragma unroll
        for (int u = 0; u < kRows; ++u) {
            if (u >= count) continue;
            scale[u] = cache_scale<kCache>(args.v_cache, head_of(u));
            const Storage* in = static_cast<const Storage*>(args.v) + args.v_geometry.offset(0, head_of(u), token, 0);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int64_t run = first + r * int64_t(blockDim.x);
                if (run < args.v_runs) data[u][r] = load16(in + run * kWidth);
            }
        }
        const SlotRows target = slot_rows(args, read_slot(args, token, previous));
        if (target.slot < 0) return;
#pragma unroll
        for (int u = 0; u < kRows; ++u) {
            if (u >= count) continue;
            const int64_t head = head_of(u);
            const int64_t cache_row = target.v_row + head * args.v_cache.stride_head;
            const Quantizer<kCache> quantizer(scale[u]);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int64_t run = first + r * int64_t(blockDim.x);
                if (run < args.v_runs)
                    store_cache_copy<kCache>(args.v_cache, cache_row + run * kWidth, quantizer, data[u][r]);
            }
        }
    }
}

/// The kernel: each unit a rotating slice or a v slice of one token (the top of the file).
/// kSharePairs: a warp of one token's rotating units splits their cos/sin (prologue.cuh,
/// PairShare), for calls that do not fill the GPU (launch_append), whose slices are at most
/// kSmallCallRows rows.
template <typename Storage, Style kStyle, bool kDefaultAngleOnly, CacheDType kCache, int Capacity, bool kSharePairs>
__global__ void __launch_bounds__(kAppendBlockThreads, kAppendMinBlocks<kDefaultAngleOnly, kCache, kSharePairs>)
    rope_kv_append_kernel(const __grid_constant__ AppendArgs<Capacity> args) {
    allow_next_kernel();    // Programmatic dependent launch (5.).
    PreviousGrid previous;  // Waited for before the first global memory access.
    constexpr int kRows = kSharePairs ? kSmallCallRows : kAppendRows<kCache>;
    const int64_t step = int64_t(gridDim.x) * blockDim.y;
    for (int64_t unit = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; unit < args.units; unit += step) {
        const int64_t token = args.by_slices.divide(unit);
        const int64_t slice = unit - token * args.slices;
        if (slice < args.rotating_slices) {
            // Rotating units come first in a token's numbering: a warp whose first and last are of one
            // token and whose last rotates is all rotating units of that token.
            PairShare share;
            if constexpr (kSharePairs)
                share = warp_pair_share<VectorPath<Storage, kStyle>>(true, unit, args.units, [&](int64_t other) {
                    const int64_t other_token = args.by_slices.divide(other);
                    const int64_t other_slice = other - other_token * args.slices;
                    return other_slice < args.rotating_slices ? other_token : -1 - other_token;
                });
            rotate_slice<Storage, kStyle, kDefaultAngleOnly, kCache, kRows>(args, token, slice, share, previous);
        } else {
            copy_v_slice<Storage, kCache, kRows>(args, token, slice - args.rotating_slices, previous);
        }
    }
}

/// Whether every run a thread moves into @p cache is aligned for one store (16 bytes
/// for a model-dtype cache, a run of FP8 codes for an FP8 one).
template <typename Storage>
bool cache_runs_aligned(const KvAppendPlan& plan, const CacheTarget& cache) {
    const int64_t element = cache.dtype == CacheDType::model ? int64_t(sizeof(Storage)) : 1;
    const int64_t run_bytes = Vector16<Storage>::kWidth * element;
    if (reinterpret_cast<uintptr_t>(cache.data) % uintptr_t(run_bytes) != 0) return false;
    const int64_t pages = plan.slot_limit / plan.page_size;
    // A stride matters only along an axis with more than one index.
    const int64_t axes[3][2] = {
        {pages, cache.stride_page}, {plan.page_size, cache.stride_slot}, {cache.heads, cache.stride_head}};
    for (const auto& axis : axes)
        if (axis[0] > 1 && (axis[1] * element) % run_bytes != 0) return false;
    return true;
}

/// Whether every run of FP8 codes a thread writes into q's FP8 output is aligned for one store.
template <typename Storage>
bool q_fp8_runs_aligned(const KvAppendPlan& plan) {
    const CacheTarget& out = plan.q_fp8;
    const int64_t run_bytes = Vector16<Storage>::kWidth;
    return reinterpret_cast<uintptr_t>(out.data) % uintptr_t(run_bytes) == 0 &&
           (plan.tokens() <= 1 || out.stride_page % run_bytes == 0) &&
           (out.heads <= 1 || out.stride_head % run_bytes == 0);
}

/// Whether the 16-byte kernel can run @p plan: whole chunks and runs, every row aligned,
/// k and v caches of one type, and an FP8 q output (if any) in that type.
template <typename Storage>
bool append_vector_fits(const KvAppendPlan& plan) {
    const Plan& rope = plan.rope;
    const bool q_fits = !plan.quantises_q() || (plan.q_fp8.dtype == plan.k_cache.dtype && q_fp8_runs_aligned<Storage>(plan));
    return rope.pairs > 0 && q_fits && plan.k_cache.dtype == plan.v_cache.dtype && vector_path_fits<Storage>(rope) &&
           plan.v_geometry.head_dim % Vector16<Storage>::kWidth == 0 &&
           rows_vectorizable<Storage>(plan.v, plan.v_geometry) && cache_runs_aligned<Storage>(plan, plan.k_cache) &&
           cache_runs_aligned<Storage>(plan, plan.v_cache);
}

/// Builds the arguments and grid, and launches the kernel for the plan's angle rule.
template <typename Storage, Style kStyle, int Capacity>
void launch_append(const KvAppendPlan& plan, const DeviceInfo& device) {
    constexpr int kWidth = Vector16<Storage>::kWidth;
    const Plan& rope = plan.rope;
    AppendArgs<Capacity> args{};
    args.q = rope.q;
    args.k = rope.k;
    args.v = plan.v;
    args.v_geometry = plan.v_geometry;
    args.positions = rope.positions;
    args.angles = make_angle_args<Capacity>(rope);
    args.axes = rope.axes;
    args.positions_in_memory = rope.positions.ids != nullptr || rope.positions.cu_seqlens != nullptr ||
                               rope.angles.table.data != nullptr ||
                               (rope.positions.relative &&  // As the RoPE kernel's (unit_kernel.cuh, plan_units).
                                (rope.positions.from.ids != nullptr || rope.positions.from.cu_seqlens != nullptr));
    args.rotary_dim = rope.rotary_dim;
    args.q_heads = rope.q.in_geometry.heads;
    args.k_heads = rope.k.in_geometry.heads;
    args.rows = args.q_heads + args.k_heads;
    args.rotary_chunks = rope.pairs / kWidth;
    args.chunks = args.rotary_chunks + (rope.head_dim - rope.rotary_dim) / kWidth;
    args.v_runs = plan.v_geometry.head_dim / kWidth;
    args.slots = plan.slots;
    args.slot_count = plan.slot_count;
    args.slot_limit = plan.slot_limit;
    args.k_cache = plan.k_cache;
    args.v_cache = plan.v_cache;
    args.q_fp8 = plan.q_fp8;

    // The regime (4.), from how much of the GPU one thread per chunk of every row (v's included)
    // would fill: all of it, kAppendRows a thread (four, or two into FP8 caches); a quarter or more,
    // two (the cos/sin of a chunk, computed once per thread, would otherwise cost more than the
    // parallelism gains); less, one.
    const int64_t tokens = plan.tokens();
    const int64_t block_x = std::min<int64_t>(args.chunks, kAppendBlockThreads);
    const int64_t block_y = std::max<int64_t>(1, kAppendBlockThreads / block_x);
    const int64_t threads = tokens * (args.rows + args.k_heads) * block_x;
    const int64_t slots = int64_t(device.multiprocessors) * kThreadSlotsPerSM;
    const int64_t most_rows = plan.k_cache.dtype == CacheDType::model ? kAppendRows<CacheDType::model>
                                                                       : kAppendRows<CacheDType::e4m3fn>;
    const int64_t per_slice = threads >= slots ? most_rows : 4 * threads >= slots ? 2 : 1;
    args.rotating_slices = (args.rows + per_slice - 1) / per_slice;
    args.v_slices = (args.k_heads + per_slice - 1) / per_slice;
    args.slices = args.rotating_slices + args.v_slices;
    args.units = tokens * args.slices;
    args.by_slices = FastDivisor(args.slices);
    // Shared cos/sin (PairShare) only where the call does not fill the GPU: with four rows a thread
    // the sincosf are shared already, and the exchange's registers would make the FP8 kernels
    // spill under their register bound. Head_dim 128 only (pairs_shareable),
    // whose pairs fit the small capacity: no other capacity is compiled with it.
    const bool share_pairs = threads < slots &&
                             pairs_shareable<VectorPath<Storage, kStyle>>(block_x, args.chunks, args.rotary_chunks);
    args.by_page_size = FastDivisor(plan.page_size);
    const int64_t blocks = (args.units + block_y - 1) / block_y;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(blocks, INT_MAX)));  // The unit loop covers the rest.
    const dim3 block(static_cast<unsigned>(block_x), static_cast<unsigned>(block_y));
    const ProgrammaticLaunch programmatic(grid, block, stream_of(rope), device);
    // The default angle gets a kernel of its own, as in the RoPE kernel (unit_kernel.cuh, launch_units),
    // and each cache type one (the top of the file; append_vector_fits sent mixed types elsewhere).
    auto launch = [&](auto default_angle_only, auto cache) {
        constexpr bool kDefault = decltype(default_angle_only)::value;
        constexpr CacheDType kCache = decltype(cache)::value;
        if constexpr (Capacity == kSmallAppendCapacity) {
            if (share_pairs)
                return launch_kernel("rope_kv_append_kernel", programmatic.config,
                                     rope_kv_append_kernel<Storage, kStyle, kDefault, kCache, Capacity, true>, args);
        }
        launch_kernel("rope_kv_append_kernel", programmatic.config,
                      rope_kv_append_kernel<Storage, kStyle, kDefault, kCache, Capacity, false>, args);
    };
    auto launch_cache = [&](auto default_angle_only) {
        switch (plan.k_cache.dtype) {
            case CacheDType::model:
                return launch(default_angle_only, std::integral_constant<CacheDType, CacheDType::model>{});
            case CacheDType::e4m3fn:
                return launch(default_angle_only, std::integral_constant<CacheDType, CacheDType::e4m3fn>{});
            case CacheDType::e5m2:
                return launch(default_angle_only, std::integral_constant<CacheDType, CacheDType::e5m2>{});
        }
    };
    if (default_angle_only(rope.angles))
        launch_cache(std::true_type{});
    else
        launch_cache(std::false_type{});
}

template <typename Storage, Style kStyle>
void launch_styled_append(const KvAppendPlan& plan, const DeviceInfo& device) {
    if (plan.rope.pairs <= kSmallAppendCapacity)
        launch_append<Storage, kStyle, kSmallAppendCapacity>(plan, device);
    else
        launch_append<Storage, kStyle, int(kMaxPairs)>(plan, device);
}

}  // namespace

void launch_kv_append_optimized(const KvAppendPlan& plan, const DeviceInfo& device) {
    const bool vector = dispatch_dtype(plan.rope.dtype, [&](auto storage) {
        return append_vector_fits<decltype(storage)>(plan);
    });
    if (!vector) {
        launch_kv_append_generic(plan);  // Checks its pointers itself.
        return;
    }
    check_device_pointers(plan);
    dispatch_dtype(plan.rope.dtype, [&](auto storage) {
        using Storage = decltype(storage);
        if (plan.rope.style == Style::half_split)
            launch_styled_append<Storage, Style::half_split>(plan, device);
        else
            launch_styled_append<Storage, Style::interleaved>(plan, device);
    });
}

}  // namespace rope::cuda_detail

#pragma once
/// @file row_access.cuh
/// @brief How a cuda-optimized thread reads, rotates and writes its piece of a head row
/// (internal to the CUDA backends).
///
/// cuda-optimized gives each thread a fixed *chunk* of every head row it
/// visits: a few pairs to rotate, or a few pass-through features to copy. Two
/// access paths define what a chunk is:
///
/// - VectorPath: a chunk is two 16-byte vectors (4 fp32 or 8 fp16/bf16 values
///   each), each moved with one 128-bit load and one 128-bit store. This is the
///   fast path, used when rows are contiguous and 16-byte aligned.
/// - GenericPath: a chunk is one pair (or one pass-through feature), moved
///   with scalar accesses through the full strides. It handles every view the
///   Plan allows (stride_dim != 1, odd offsets) and is the correctness fallback.
///
/// Both expose the same static interface, so one kernel serves both:
/// kPairs, kPassElements, kRowsInFlight, kMinBlocksPerSM, Pairs, fits, pair_of,
/// load, rotate, store, load_pass, store_pass.

#include <cstdint>
#include <cstring>

#include "rope/dtype.hpp"
#include "rope/rotation.hpp"

namespace rope::cuda_detail {

/// @brief Where one head row lives, in input and output, with the feature stride of each.
template <typename Storage>
struct RowRef {
    const Storage* in;  ///< Feature 0 of the input row.
    Storage* out;       ///< Feature 0 of the output row.
    int64_t in_step;    ///< Elements between features of the input (stride_dim).
    int64_t out_step;   ///< Elements between features of the output.
};

/// @brief 16 bytes of storage, the widest load a thread can issue in one instruction.
template <typename Storage>
struct alignas(16) Vector16 {
    static constexpr int kWidth = 16 / int(sizeof(Storage));  ///< Values per vector: 4 fp32, 8 fp16/bf16.
    Storage value[kWidth];                                   ///< The values, in feature order.
};

/// @brief 16-byte accesses as plain dereferences: the compiler picks the instructions.
///
/// It emits 128-bit loads, but may split a 128-bit store into narrower ones
/// where it cannot re-derive the alignment from the pointer arithmetic (it did
/// so for the vector half a rotary block away).
struct PlainAccess {
    __device__ static uint4 load(const void* source) { return *static_cast<const uint4*>(source); }
    __device__ static void store(void* target, const uint4& value) { *static_cast<uint4*>(target) = value; }
};

/// @brief 16-byte accesses through the cache-operator intrinsics (ld.global.ca /
/// st.global.wb): always single 128-bit global instructions.
struct CachedAccess {
    __device__ static uint4 load(const void* source) { return __ldca(static_cast<const uint4*>(source)); }
    __device__ static void store(void* target, const uint4& value) { __stwb(static_cast<uint4*>(target), value); }
};

/// @brief 16-byte accesses marked streaming (ld.global.cs / st.global.cs: evict first).
struct StreamingAccess {
    __device__ static uint4 load(const void* source) { return __ldcs(static_cast<const uint4*>(source)); }
    __device__ static void store(void* target, const uint4& value) { __stcs(static_cast<uint4*>(target), value); }
};

/// @brief One 16-byte load (LDG.E.128 in SASS). @pre @p source is 16-byte aligned.
template <typename Access, typename Storage>
__device__ inline Vector16<Storage> load16(const Storage* source) {
    const uint4 raw = Access::load(source);
    Vector16<Storage> vector;
    memcpy(&vector, &raw, sizeof raw);  // A register-to-register reinterpretation: compiles to nothing.
    return vector;
}

/// @brief One 16-byte store (STG.E.128 in SASS, unless Access lets the compiler split it).
/// @pre @p target is 16-byte aligned.
template <typename Access, typename Storage>
__device__ inline void store16(Storage* target, const Vector16<Storage>& vector) {
    uint4 raw;
    memcpy(&raw, &vector, sizeof raw);
    Access::store(target, raw);
}

/// @brief The 16-byte path for contiguous, aligned rows, specialised on the pairing style.
///
/// A chunk is two 16-byte vectors of a row: the one at feature c*W and the one
/// at feature rotary_dim/2 + c*W (W values per vector). Neighbouring threads
/// take neighbouring chunks, so each of the two loads is coalesced across the
/// warp, and both styles keep every pair inside one thread (no shuffles, no
/// shared memory):
///
/// - half-split (pair i = features i and i + rotary_dim/2): the first vector
///   holds the x's of pairs cW ... cW+W-1 and the second vector their y's;
/// - interleaved (pair i = features 2i and 2i+1): the pairs sit inside each
///   vector, W/2 in the first and W/2 in the second.
///
/// Taking the second vector half a rotary block away (rather than the next
/// one) gives interleaved rows the same access pattern, and the same number of
/// pairs per thread, as half-split rows: 32 bytes moved per row visit instead
/// of 16 halves the per-row address arithmetic.
///
/// @tparam Access how the 16-byte accesses are issued (PlainAccess, CachedAccess, StreamingAccess)
/// @tparam Pipelined whether a thread's row batches are software-pipelined (optimized_kernel.cuh)
template <typename Storage, Style kStyle, typename Access = PlainAccess, bool Pipelined = true>
struct VectorPath {
    static constexpr int kWidth = Vector16<Storage>::kWidth;
    /// Pairs rotated per chunk.
    static constexpr int kPairs = kWidth;
    /// Pass-through features copied per chunk.
    static constexpr int kPassElements = kWidth;
    /// Whether row batches are software-pipelined (the next batch's loads issued
    /// before the current batch is computed). Measured on the H200 with
    /// rope-cuda-self-check --tune: it pays in the latency regime and for fp32;
    /// the 2-byte types in the bandwidth regime do better with bigger batches
    /// without a pipeline (fewer live registers, more resident threads).
    static constexpr bool kPipelined = Pipelined;
    /// Rows per batch: 2 pipelined (four 16-byte loads in flight while the
    /// previous two rows are computed) or 4 without a pipeline.
    static constexpr int kRowsInFlight = Pipelined ? 2 : 4;
    /// Rows a thread visits per token in the bandwidth regime: 16. Averaged
    /// over two H200 tune sweeps it is best for bf16 on [8,32,4096,128] (1.2
    /// points ahead of 8) and within 0.2 points of the best for fp32: enough
    /// rows to amortise the unit's sincosf and index arithmetic, few enough
    /// for short-lived threads.
    static constexpr int64_t kMaxRowsPerSlice = 16;
    /// Blocks of kMaxBlockThreads the compiler must fit per SM (1: no register
    /// cap). Nsight Compute shows 148 registers a thread for bf16 and 18.75%
    /// occupancy, yet caps of 128 and 80 registers measured no faster over
    /// two sweeps (80 slower): the loads in flight per thread, not the
    /// number of threads, carry the bandwidth.
    static constexpr int kMinBlocksPerSM = 1;

    /// The raw chunk of one row.
    struct Pairs {
        Vector16<Storage> first;   ///< Features cW ... cW+W-1.
        Vector16<Storage> second;  ///< Features rotary_dim/2 + cW ... rotary_dim/2 + cW+W-1.
    };

    /// Whether a plan's pairs split into whole chunks (else the generic path runs).
    static bool fits(int64_t rotary_dim, int64_t head_dim) {
        return (rotary_dim / 2) % kWidth == 0 && (head_dim - rotary_dim) % kPassElements == 0;
    }

    /// Pair index of slot @p p (0 <= p < kPairs) of chunk @p chunk: whose cos/sin it needs.
    ROPE_HOST_DEVICE static int64_t pair_of(int64_t chunk, int p, int64_t rotary_dim) {
        if constexpr (kStyle == Style::half_split) return chunk * kWidth + p;
        // Interleaved: feature f holds half of pair f/2.
        const int64_t feature = p < kWidth / 2 ? chunk * kWidth + 2 * p : rotary_dim / 2 + chunk * kWidth + 2 * (p - kWidth / 2);
        return feature / 2;
    }

    /// Reads chunk @p chunk of a row.
    __device__ static Pairs load(const RowRef<Storage>& row, int64_t chunk, Style, int64_t rotary_dim) {
        const int64_t first = chunk * kWidth;
        return {load16<Access>(row.in + first), load16<Access>(row.in + rotary_dim / 2 + first)};
    }

    /// Rotates every pair of the chunk, widening to float32 and rounding back.
    /// Slot p's factors are cos_angle[p], sin_angle[p] (pair pair_of(chunk, p)).
    __device__ static void rotate(Pairs& pairs, const float (&cos_angle)[kPairs], const float (&sin_angle)[kPairs]) {
#pragma unroll
        for (int p = 0; p < kPairs; ++p) {
            Vector16<Storage>& holder = kStyle == Style::half_split || p < kWidth / 2 ? pairs.first : pairs.second;
            const int at = p % (kWidth / 2);
            // Half-split: x in the first vector, y at the same place in the second.
            // Interleaved: x and y side by side in one vector.
            Storage& x_storage = kStyle == Style::half_split ? pairs.first.value[p] : holder.value[2 * at];
            Storage& y_storage = kStyle == Style::half_split ? pairs.second.value[p] : holder.value[2 * at + 1];
            float x = to_float(x_storage);
            float y = to_float(y_storage);
            rotate_pair(x, y, cos_angle[p], sin_angle[p]);
            x_storage = from_float<Storage>(x);
            y_storage = from_float<Storage>(y);
        }
    }

    /// Writes the chunk back where load() found it, in the output row.
    __device__ static void store(const RowRef<Storage>& row, int64_t chunk, Style, int64_t rotary_dim,
                                 const Pairs& pairs) {
        const int64_t first = chunk * kWidth;
        store16<Access>(row.out + first, pairs.first);
        store16<Access>(row.out + rotary_dim / 2 + first, pairs.second);
    }

    /// Raw 16-byte copy of the pass-through features feature ... feature + kPassElements - 1.
    __device__ static Vector16<Storage> load_pass(const RowRef<Storage>& row, int64_t feature) {
        return load16<Access>(row.in + feature);
    }
    /// Writes what load_pass read.
    __device__ static void store_pass(const RowRef<Storage>& row, int64_t feature, const Vector16<Storage>& value) {
        store16<Access>(row.out + feature, value);
    }
};

/// @brief The path for any view the Plan allows: one pair per chunk, scalar strided accesses.
///
/// This is cpu-naive's access pattern, kept correct for every stride; it is
/// slower (an element per access, possibly uncoalesced) but it still shares
/// cos/sin across heads like the vector path.
template <typename Storage>
struct GenericPath {
    static constexpr int kPairs = 1;         ///< One pair per chunk.
    static constexpr int kPassElements = 1;  ///< One pass-through feature per chunk.
    static constexpr int kRowsInFlight = 4;  ///< Scalar loads are small: keep more of them in flight.
    static constexpr int kMinBlocksPerSM = 1;  ///< No register cap.
    static constexpr bool kPipelined = true;  ///< Next batch's loads overlap this batch's work.
    static constexpr int64_t kMaxRowsPerSlice = 16;  ///< Rows per thread at most (bandwidth regime).

    /// Any plan fits.
    static bool fits(int64_t, int64_t) { return true; }
    /// A chunk is one pair.
    ROPE_HOST_DEVICE static int64_t pair_of(int64_t chunk, int, int64_t) { return chunk; }

    /// One pair, already widened to float32.
    struct Pairs {
        float x;
        float y;
    };

    /// Reads pair @p pair of a row.
    __device__ static Pairs load(const RowRef<Storage>& row, int64_t pair, Style style, int64_t rotary_dim) {
        const PairIndex at = pair_elements(style, rotary_dim, pair);
        return {to_float(row.in[at.first * row.in_step]), to_float(row.in[at.second * row.in_step])};
    }

    __device__ static void rotate(Pairs& pairs, const float (&cos_angle)[1], const float (&sin_angle)[1]) {
        rotate_pair(pairs.x, pairs.y, cos_angle[0], sin_angle[0]);
    }

    __device__ static void store(const RowRef<Storage>& row, int64_t pair, Style style, int64_t rotary_dim,
                                 const Pairs& pairs) {
        const PairIndex at = pair_elements(style, rotary_dim, pair);
        row.out[at.first * row.out_step] = from_float<Storage>(pairs.x);
        row.out[at.second * row.out_step] = from_float<Storage>(pairs.y);
    }

    __device__ static Storage load_pass(const RowRef<Storage>& row, int64_t feature) {
        return row.in[feature * row.in_step];
    }
    __device__ static void store_pass(const RowRef<Storage>& row, int64_t feature, Storage value) {
        row.out[feature * row.out_step] = value;
    }
};

}  // namespace rope::cuda_detail

#pragma once
/// @file row_access.cuh
/// @brief How a cuda-optimized thread reads, rotates and writes its piece of a head row
/// (internal to the CUDA backends).
///
/// cuda-optimized gives each thread a fixed *chunk* of every head row it
/// visits: a few pairs to rotate, or a few pass-through features to copy. Two
/// access paths define what a chunk is:
///
/// - VectorPath: a chunk is 16 bytes (4 fp32 or 8 fp16/bf16 values), moved
///   with one 128-bit load and one 128-bit store. This is the fast path, used
///   when rows are contiguous and 16-byte aligned.
/// - GenericPath: a chunk is one pair (or one pass-through feature), moved
///   with scalar accesses through the full strides. It handles every view the
///   Plan allows (stride_dim != 1, odd offsets) and is the correctness fallback.
///
/// Both expose the same static interface, so one kernel serves both:
/// kPairs / kPassElements, Pairs, load, rotate, store, copy_pass.

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

/// @brief One 128-bit load (LDG.E.128 in SASS). @pre @p source is 16-byte aligned.
template <typename Storage>
__device__ inline Vector16<Storage> load16(const Storage* source) {
    const uint4 raw = *reinterpret_cast<const uint4*>(source);
    Vector16<Storage> vector;
    memcpy(&vector, &raw, sizeof raw);  // A register-to-register reinterpretation: compiles to nothing.
    return vector;
}

/// @brief One 128-bit store (STG.E.128 in SASS). @pre @p target is 16-byte aligned.
template <typename Storage>
__device__ inline void store16(Storage* target, const Vector16<Storage>& vector) {
    uint4 raw;
    memcpy(&raw, &vector, sizeof raw);
    *reinterpret_cast<uint4*>(target) = raw;
}

/// @brief The 16-byte path for contiguous, aligned rows, specialised on the pairing style.
///
/// Half-split (pair i = features i and i + rotary_dim/2): chunk c is the
/// 16 bytes starting at feature c*W (the x's of W pairs) plus the matching 16
/// bytes of the second half (their y's). Both halves' loads are coalesced
/// across the warp (neighbouring threads take neighbouring chunks), and every
/// pair stays inside one thread: no shuffles, no shared memory.
///
/// Interleaved (pair i = features 2i and 2i+1): the pairs sit inside the
/// vector, so chunk c is the single 16 bytes at feature c*W, holding W/2 pairs.
template <typename Storage, Style kStyle>
struct VectorPath {
    static constexpr int kWidth = Vector16<Storage>::kWidth;
    /// Pairs rotated per chunk.
    static constexpr int kPairs = kStyle == Style::half_split ? kWidth : kWidth / 2;
    /// Pass-through features copied per chunk.
    static constexpr int kPassElements = kWidth;
    /// Rows a thread loads before rotating the first: four 16-byte loads in flight
    /// (two per half-split row, one per interleaved row), at a register cost
    /// that still lets 512 or more threads reside per SM.
    static constexpr int kRowsInFlight = kStyle == Style::half_split ? 2 : 4;
    /// Blocks of 256 threads the compiler must fit per SM (1: no register cap).
    static constexpr int kMinBlocksPerSM = 1;

    /// The raw chunk of one row (`second` is unused for interleaved pairs).
    struct Pairs {
        Vector16<Storage> first;
        Vector16<Storage> second;
    };

    /// Reads chunk @p chunk of a row: the pairs chunk*kPairs ... chunk*kPairs + kPairs-1.
    __device__ static Pairs load(const RowRef<Storage>& row, int64_t chunk, Style, int64_t rotary_dim) {
        // Where the chunk's first pair sits, by the shared rule; the rest follow contiguously.
        const PairIndex at = pair_elements(kStyle, rotary_dim, chunk * kPairs);
        Pairs pairs;
        pairs.first = load16(row.in + at.first);
        if constexpr (kStyle == Style::half_split) pairs.second = load16(row.in + at.second);
        return pairs;
    }

    /// Rotates every pair of the chunk, widening to float32 and rounding back.
    __device__ static void rotate(Pairs& pairs, const float (&cos_angle)[kPairs], const float (&sin_angle)[kPairs]) {
#pragma unroll
        for (int p = 0; p < kPairs; ++p) {
            Storage& x_storage = kStyle == Style::half_split ? pairs.first.value[p] : pairs.first.value[2 * p];
            Storage& y_storage = kStyle == Style::half_split ? pairs.second.value[p] : pairs.first.value[2 * p + 1];
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
        const PairIndex at = pair_elements(kStyle, rotary_dim, chunk * kPairs);
        store16(row.out + at.first, pairs.first);
        if constexpr (kStyle == Style::half_split) store16(row.out + at.second, pairs.second);
    }

    /// Raw 16-byte copy of the pass-through features feature ... feature + kPassElements - 1.
    __device__ static Vector16<Storage> load_pass(const RowRef<Storage>& row, int64_t feature) {
        return load16(row.in + feature);
    }
    /// Writes what load_pass read.
    __device__ static void store_pass(const RowRef<Storage>& row, int64_t feature, const Vector16<Storage>& value) {
        store16(row.out + feature, value);
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

    /// One pair, already widened to float32.
    struct Pairs {
        float x;
        float y;
    };

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

#pragma once
/// @file row_access.cuh
/// @brief How a cuda-optimized thread reads, rotates and writes one *chunk* of a
/// head row (internal to the CUDA backends).
///
/// Two access paths define what a chunk is; both expose the same static
/// interface (kPairs, kPassWidth, Chunk, Pass, pair_of, load_pair_axes, load,
/// rotate, store, load_pass, store_pass), so one kernel serves both:
///
/// - VectorPath: a chunk is two 16-byte vectors (vector_layout.hpp), each
///   moved with one 128-bit load and one 128-bit store. The fast path, used
///   when rows are contiguous and 16-byte aligned.
/// - GenericPath: a chunk is one pair, moved with scalar accesses through the
///   full strides. It handles every view the Plan allows (stride_dim != 1,
///   odd offsets) and is the correctness fallback.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "rope/detail/plan.hpp"
#include "rope/dtype.hpp"
#include "rope/rotation.hpp"
#include "vector_layout.hpp"

namespace rope::cuda_detail {

/// @brief One head row in input and output, with the distance between features of each.
template <typename Storage>
struct RowRef {
    const Storage* in;     ///< Feature 0 of the input row.
    Storage* out;          ///< Feature 0 of the output row.
    int64_t in_stride;     ///< Elements between features of the input (stride_dim).
    int64_t out_stride;    ///< Elements between features of the output.
};

/// @brief 16 bytes of storage, the widest access a thread can issue in one instruction.
template <typename Storage>
struct alignas(16) Vector16 {
    static constexpr int kWidth = vector_width<Storage>();  ///< Values per vector: 4 fp32, 8 fp16/bf16.
    Storage value[kWidth];                                  ///< The values, in feature order.
};

/// @brief One 16-byte load (LDG.E.128 in SASS). @pre @p source is 16-byte aligned.
///
/// Through the cache-operator intrinsic (ld.global.ca, the default caching): always one
/// 128-bit instruction, which a plain dereference does not guarantee (the compiler may split
/// an access whose alignment it cannot re-derive). Not the read-only path (__ldg): an in-place
/// call writes what it reads. Not the streaming hints either (ld.global.cs / st.global.cs,
/// each byte being touched once): the lab's sweep measured them slower (bench/tune.cu).
template <typename Storage>
__device__ inline Vector16<Storage> load16(const Storage* source) {
    const uint4 raw = __ldca(reinterpret_cast<const uint4*>(source));
    Vector16<Storage> vector;
    memcpy(&vector, &raw, sizeof raw);  // A register-to-register reinterpretation: compiles to nothing.
    return vector;
}

/// @brief One 16-byte store (STG.E.128 in SASS, st.global.wb). @pre @p target is 16-byte aligned.
template <typename Storage>
__device__ inline void store16(Storage* target, const Vector16<Storage>& vector) {
    uint4 raw;
    memcpy(&raw, &vector, sizeof raw);
    __stwb(reinterpret_cast<uint4*>(target), raw);
}

/// @brief Copies @p N consecutive bytes (2, 4 or 8) starting at @p source, a multiple of @p N
/// bytes, with one read: one constant-bank access where @p source is a kernel parameter.
template <int N>
__device__ inline void read_bytes(const uint8_t* source, uint8_t* target) {
    static_assert(N == 2 || N == 4 || N == 8, "read_bytes: 2, 4 or 8 bytes");
    using Word = std::conditional_t<N == 8, uint64_t, std::conditional_t<N == 4, uint32_t, uint16_t>>;
    const Word word = *reinterpret_cast<const Word*>(source);
#pragma unroll
    for (int i = 0; i < N; ++i) target[i] = uint8_t(word >> (8 * i));  // Little-endian: byte i is source[i].
}

/// @brief The 16-byte path for contiguous, aligned rows, specialised on the pairing style
/// (vector_layout.hpp says which pairs a chunk holds).
template <typename Storage, Style kStyle>
struct VectorPath {
    static constexpr int kWidth = Vector16<Storage>::kWidth;
    static constexpr int kPairs = kWidth;      ///< Pairs rotated per chunk.
    static constexpr int kPassWidth = kWidth;  ///< Pass-through features copied per pass chunk.

    /// One chunk of a row: features cW ... and rotary_dim/2 + cW ...
    struct Chunk {
        Vector16<Storage> first;   ///< Features cW ... cW+W-1.
        Vector16<Storage> second;  ///< Features rotary_dim/2 + cW ... rotary_dim/2 + cW+W-1.
    };
    using Pass = Vector16<Storage>;  ///< kPassWidth pass-through features, as stored.

    /// Pair held by slot @p slot of chunk @p chunk.
    ROPE_HOST_DEVICE static int64_t pair_of(int64_t chunk, int slot, int64_t rotary_dim) {
        return vector_pair_of(kStyle, kWidth, chunk, slot, rotary_dim);
    }

    /// The axis of each pair of chunk @p chunk (slot order), from @p pair_axis (AngleArgs::pair_axis,
    /// 8-byte aligned): a chunk's pairs are one run of consecutive indices (half-split) or two
    /// (interleaved), each read as one word.
    __device__ static void load_pair_axes(const uint8_t* pair_axis, int64_t chunk, int64_t rotary_dim,
                                          uint8_t (&axis)[kPairs]) {
        constexpr int kRun = kStyle == Style::half_split ? kPairs : kPairs / 2;
#pragma unroll
        for (int slot = 0; slot < kPairs; slot += kRun)
            read_bytes<kRun>(pair_axis + pair_of(chunk, slot, rotary_dim), &axis[slot]);
    }

    /// Reads chunk @p chunk of a row.
    __device__ static Chunk load(const RowRef<Storage>& row, int64_t chunk, int64_t rotary_dim) {
        const int64_t first = chunk * kWidth;
        return {load16(row.in + first), load16(row.in + rotary_dim / 2 + first)};
    }

    /// Rotates every pair of the chunk, widening to float32 and rounding back.
    /// Slot p's factors are cos_angle[p], sin_angle[p] (pair pair_of(chunk, p)).
    __device__ static void rotate(Chunk& chunk, const float (&cos_angle)[kPairs], const float (&sin_angle)[kPairs]) {
#pragma unroll
        for (int p = 0; p < kPairs; ++p) {
            // Half-split: x in the first vector, y at the same place in the second.
            // Interleaved: x and y side by side, in the first vector for the first half of the slots.
            Vector16<Storage>& holder = kStyle == Style::half_split || p < kWidth / 2 ? chunk.first : chunk.second;
            const int at = p % (kWidth / 2);
            Storage& x_storage = kStyle == Style::half_split ? chunk.first.value[p] : holder.value[2 * at];
            Storage& y_storage = kStyle == Style::half_split ? chunk.second.value[p] : holder.value[2 * at + 1];
            float x = to_float(x_storage);
            float y = to_float(y_storage);
            rotate_pair(x, y, cos_angle[p], sin_angle[p]);
            x_storage = from_float<Storage>(x);
            y_storage = from_float<Storage>(y);
        }
    }

    /// Writes the chunk back where load() found it, in the output row.
    __device__ static void store(const RowRef<Storage>& row, int64_t chunk, int64_t rotary_dim, const Chunk& data) {
        const int64_t first = chunk * kWidth;
        store16(row.out + first, data.first);
        store16(row.out + rotary_dim / 2 + first, data.second);
    }

    /// Raw copy of the pass-through features feature ... feature + kPassWidth - 1.
    __device__ static Pass load_pass(const RowRef<Storage>& row, int64_t feature) {
        return load16(row.in + feature);
    }
    /// Writes what load_pass read.
    __device__ static void store_pass(const RowRef<Storage>& row, int64_t feature, const Pass& data) {
        store16(row.out + feature, data);
    }
};

/// @brief The path for any view the Plan allows: one pair per chunk, scalar strided accesses.
///
/// cpu-naive's access pattern, correct for every stride; slower (an element
/// per access, possibly uncoalesced), but it shares the tile's cos/sin like
/// the vector path.
template <typename Storage, Style kStyle>
struct GenericPath {
    static constexpr int kPairs = 1;      ///< One pair per chunk.
    static constexpr int kPassWidth = 1;  ///< One pass-through feature per pass chunk.

    /// One pair, already widened to float32.
    struct Chunk {
        float x;  ///< The pair's first feature.
        float y;  ///< Its second feature.
    };
    using Pass = Storage;  ///< One pass-through feature, as stored (copied bit for bit).

    /// A chunk is one pair.
    ROPE_HOST_DEVICE static int64_t pair_of(int64_t chunk, int, int64_t) { return chunk; }

    /// The axis of the chunk's one pair.
    __device__ static void load_pair_axes(const uint8_t* pair_axis, int64_t pair, int64_t, uint8_t (&axis)[1]) {
        axis[0] = pair_axis[pair];
    }

    /// Reads pair @p pair of a row (its two features, through the stride).
    __device__ static Chunk load(const RowRef<Storage>& row, int64_t pair, int64_t rotary_dim) {
        const PairIndex at = pair_elements(kStyle, rotary_dim, pair);
        return {to_float(row.in[at.first * row.in_stride]), to_float(row.in[at.second * row.in_stride])};
    }

    /// Rotates the pair.
    __device__ static void rotate(Chunk& chunk, const float (&cos_angle)[1], const float (&sin_angle)[1]) {
        rotate_pair(chunk.x, chunk.y, cos_angle[0], sin_angle[0]);
    }

    /// Writes the pair where load() found it, in the output row.
    __device__ static void store(const RowRef<Storage>& row, int64_t pair, int64_t rotary_dim, const Chunk& chunk) {
        const PairIndex at = pair_elements(kStyle, rotary_dim, pair);
        row.out[at.first * row.out_stride] = from_float<Storage>(chunk.x);
        row.out[at.second * row.out_stride] = from_float<Storage>(chunk.y);
    }

    /// One pass-through feature, as stored.
    __device__ static Pass load_pass(const RowRef<Storage>& row, int64_t feature) {
        return row.in[feature * row.in_stride];
    }
    /// Writes what load_pass read.
    __device__ static void store_pass(const RowRef<Storage>& row, int64_t feature, Pass value) {
        row.out[feature * row.out_stride] = value;
    }
};

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

/// @brief Chunks per row for @p Path: rotating ones, plus pass-through ones when an operand
/// has a separate output (in place, those features already are where they belong).
template <typename Path>
int64_t chunks_per_row(const Plan& plan) {
    const bool copy_needed = (plan.q.in_geometry.heads > 0 && plan.q.in != plan.q.out) ||
                             (plan.k.in_geometry.heads > 0 && plan.k.in != plan.k.out);
    return plan.pairs / Path::kPairs + (copy_needed ? (plan.head_dim - plan.rotary_dim) / Path::kPassWidth : 0);
}

}  // namespace rope::cuda_detail

// cpu-eigen's row rotation as Eigen fixed-size arrays: several pairs per SIMD
// instruction, for float32 rows and for strided rows of any type (the kernels
// every other row falls back to; row.hpp lists them all).
#include <cstdint>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "rope/dtype.hpp"
#include "rope/rotation.hpp"
#include "row.hpp"

namespace rope::cpu_eigen {
namespace {

// Pairs rotated per step. Eight floats are two SSE2 registers (the portable
// baseline) or one AVX register; a fixed size lets Eigen unroll the step
// completely and keep x, y, cos and sin in registers (sixteen would spill
// SSE2's sixteen registers to the stack).
constexpr int64_t kLanes = 8;
using Lanes = Eigen::Array<float, kLanes, 1>;

// The first and second features of kLanes consecutive pairs, widened to float32.
struct PairBlock {
    Lanes x;
    Lanes y;
};

// x and y of interleaved pairs: every other float, starting at 0 or 1.
using EvenOdd = Eigen::Map<const Lanes, Eigen::Unaligned, Eigen::InnerStride<2>>;
using EvenOddOut = Eigen::Map<Lanes, Eigen::Unaligned, Eigen::InnerStride<2>>;

// Loads pairs [first, first + kLanes) of a row into registers.
//
// The fast case is float32 with unit stride: the pairs are plain memory, so
// Eigen::Map reads them in place as SIMD loads. Half-split pairs sit in two
// contiguous runs (x = features [i, i+8), y = [p+i, p+i+8)); interleaved pairs
// alternate, so x and y are one run of 16 features seen with an inner stride
// of 2. Any other row (a strided view, or fp16/bf16 to widen) is gathered
// element by element through the shared pairing rule.
//
// Forced inline (as is store_pairs): called out of line, the block would pass
// through memory instead of staying in registers.
template <typename Storage, Style kStyle, bool kUnitStride>
EIGEN_ALWAYS_INLINE PairBlock load_pairs(Row<const Storage> row, int64_t rotary_dim, int64_t first) {
    const int64_t half = rotary_dim / 2;
    if constexpr (kUnitStride && std::is_same_v<Storage, float>) {
        if constexpr (kStyle == Style::half_split)
            return {Eigen::Map<const Lanes>(row.data + first), Eigen::Map<const Lanes>(row.data + half + first)};
        else
            return {EvenOdd(row.data + 2 * first), EvenOdd(row.data + 2 * first + 1)};
    } else {
        PairBlock block;
        for (int64_t lane = 0; lane < kLanes; ++lane) {
            const PairIndex pair = pair_elements(kStyle, rotary_dim, first + lane);
            block.x[lane] = to_float(row.data[pair.first * row.stride]);
            block.y[lane] = to_float(row.data[pair.second * row.stride]);
        }
        return block;
    }
}

// Stores a rotated block: the mirror image of load_pairs, rounding to Storage.
template <typename Storage, Style kStyle, bool kUnitStride>
EIGEN_ALWAYS_INLINE void store_pairs(Row<Storage> row, int64_t rotary_dim, int64_t first, const PairBlock& block) {
    const int64_t half = rotary_dim / 2;
    if constexpr (kUnitStride && std::is_same_v<Storage, float>) {
        if constexpr (kStyle == Style::half_split) {
            Eigen::Map<Lanes>(row.data + first) = block.x;
            Eigen::Map<Lanes>(row.data + half + first) = block.y;
        } else {
            EvenOddOut(row.data + 2 * first) = block.x;
            EvenOddOut(row.data + 2 * first + 1) = block.y;
        }
    } else {
        for (int64_t lane = 0; lane < kLanes; ++lane) {
            const PairIndex pair = pair_elements(kStyle, rotary_dim, first + lane);
            row.data[pair.first * row.stride] = from_float<Storage>(block.x[lane]);
            row.data[pair.second * row.stride] = from_float<Storage>(block.y[lane]);
        }
    }
}

// Rotates one head row by the angles whose (scaled, signed) cos and sin are
// given per pair.
//
// In place is safe because a block is loaded completely (both x and y) into
// registers before any of it is stored; no scratch copy of the row is needed.
// The shape comes by value: through a reference the compiler would have to
// reload it after every store, in case the row's memory aliased it.
template <typename Storage, Style kStyle, bool kUnitStride>
void rotate_row(Row<const Storage> in, Row<Storage> out, const float* cos, const float* sin, RowShape shape) {
    const int64_t pairs = shape.pairs, rotary_dim = shape.rotary_dim;
    int64_t i = 0;
    for (; i + kLanes <= pairs; i += kLanes) {
        //! [eight pairs at once]
        const PairBlock block = load_pairs<Storage, kStyle, kUnitStride>(in, rotary_dim, i);
        const Eigen::Map<const Lanes> c(cos + i), s(sin + i);
        // rotate_pair, written for kLanes pairs at once: one SIMD multiply per term.
        const PairBlock rotated{block.x * c - block.y * s, block.y * c + block.x * s};
        store_pairs<Storage, kStyle, kUnitStride>(out, rotary_dim, i, rotated);
        //! [eight pairs at once]
    }
    // The last pairs % kLanes pairs (e.g. rotary_dim 24 = 8 + 4 pairs) take the scalar rule.
    for (; i < pairs; ++i) {
        const PairIndex pair = pair_elements(kStyle, rotary_dim, i);
        float x = to_float(in.data[pair.first * in.stride]);
        float y = to_float(in.data[pair.second * in.stride]);
        rotate_pair(x, y, cos[i], sin[i]);
        out.data[pair.first * out.stride] = from_float<Storage>(x);
        out.data[pair.second * out.stride] = from_float<Storage>(y);
    }
    // Partial rotary: features past rotary_dim are copied through as stored
    // (bit for bit). In place they already are where they belong.
    if (out.data == in.data) return;
    for (int64_t d = rotary_dim; d < shape.head_dim; ++d) out.data[d * out.stride] = in.data[d * in.stride];
}

// HF's DeepSeek order (Style::interleaved_to_half): pair i is read from features
// (2i, 2i+1) and written to (i, i + rotary_dim/2), which are other pairs' inputs
// (half_to_interleaved: the reverse). So the whole window is rotated into this
// thread's buffer before any of it is written, which keeps an in-place call right.
// Scalar: the window is short (64 features in DeepSeek) and the compiler vectorises
// the loops it can.
template <typename Storage, Style kStyle>
void rotate_row_reordered(Row<const Storage> in, Row<Storage> out, const float* cos, const float* sin,
                          RowShape shape) {
    thread_local std::vector<float> rotated;
    if (rotated.size() < size_t(shape.rotary_dim)) rotated.resize(size_t(shape.rotary_dim));
    for (int64_t i = 0; i < shape.pairs; ++i) {
        const PairIndex from = pair_elements(kStyle, shape.rotary_dim, i);
        float x = to_float(in.data[from.first * in.stride]);
        float y = to_float(in.data[from.second * in.stride]);
        rotate_pair(x, y, cos[i], sin[i]);
        const PairIndex to = output_pair_elements(kStyle, shape.rotary_dim, i);
        rotated[size_t(to.first)] = x;
        rotated[size_t(to.second)] = y;
    }
    for (int64_t d = 0; d < shape.rotary_dim; ++d) out.data[d * out.stride] = from_float<Storage>(rotated[size_t(d)]);
    if (out.data == in.data) return;
    for (int64_t d = shape.rotary_dim; d < shape.head_dim; ++d) out.data[d * out.stride] = in.data[d * in.stride];
}

}  // namespace

template <typename Storage>
RowKernel<Storage> reordering_row_kernel(Style style) {
    return style == Style::interleaved_to_half ? rotate_row_reordered<Storage, Style::interleaved_to_half>
                                               : rotate_row_reordered<Storage, Style::half_to_interleaved>;
}

template RowKernel<float> reordering_row_kernel<float>(Style);
template RowKernel<float16> reordering_row_kernel<float16>(Style);
template RowKernel<bfloat16> reordering_row_kernel<bfloat16>(Style);

template <typename Storage>
RowKernel<Storage> eigen_row_kernel(Style style, bool contiguous) {
    if (style == Style::half_split)
        return contiguous ? rotate_row<Storage, Style::half_split, true> : rotate_row<Storage, Style::half_split, false>;
    return contiguous ? rotate_row<Storage, Style::interleaved, true> : rotate_row<Storage, Style::interleaved, false>;
}

template RowKernel<float> eigen_row_kernel<float>(Style, bool);
template RowKernel<float16> eigen_row_kernel<float16>(Style, bool);
template RowKernel<bfloat16> eigen_row_kernel<bfloat16>(Style, bool);

}  // namespace rope::cpu_eigen

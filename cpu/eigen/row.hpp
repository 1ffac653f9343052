#pragma once
// cpu-eigen's row kernels: what every one of them takes, and where each lives.
//
// A row kernel rotates one head row: the pairs of its rotary part by the
// cos/sin of its token (already scaled, and signed for the inverse), and copies
// the features past rotary_dim through. Each has its storage type, pairing
// style and stride case fixed at compile time; the backend picks one per
// operand and call (pick_row_kernel in backend.cpp) and calls it through a
// pointer for every row.
//
//   rotate_row.cpp  float32 rows, and strided rows of any type: Eigen arrays
//                   (SSE2, the portable baseline); and any row in HF's DeepSeek
//                   order (reordering_row_kernel).
//   wide_rows.cpp   contiguous rows with the processor's widest instructions:
//                   fp16/bf16 widened to float32, rotated, rounded back, with
//                   its own conversions where it has them; float32 (and
//                   fp16/bf16) with AVX-512 where it has it.
#include <cstdint>

#include "rope/dtype.hpp"
#include "rope/config.hpp"

namespace rope::cpu_eigen {

// Where one head row lives: its first element and the distance between features.
template <typename Element>
struct Row {
    Element* data;
    int64_t stride;  // stride_dim, in elements.
};

// What every row of a call has in common.
struct RowShape {
    int64_t pairs;       // rotary_dim / 2.
    int64_t rotary_dim;  // Features that rotate.
    int64_t head_dim;    // Features per row; those past rotary_dim pass through.
};

// A row kernel with style, storage and stride case fixed at compile time.
template <typename Storage>
using RowKernel = void (*)(Row<const Storage>, Row<Storage>, const float*, const float*, RowShape);

// Longest rotary part a contiguous fp16/bf16 row may have to be widened on the
// stack; also the longest row the backend rotates into a buffer to stream it.
constexpr int64_t kMaxWidenedDim = 1024;

// The Eigen kernel (rotate_row.cpp) for float32 rows, and for rows of any type
// whose features are not adjacent (@p contiguous false).
template <typename Storage>
RowKernel<Storage> eigen_row_kernel(Style style, bool contiguous);

// The kernel for a style that writes pairs in another order than it reads them
// (Style::interleaved_to_half, HF's DeepSeek order, and half_to_interleaved; rotate_row.cpp),
// for any storage and stride: it reads a row's whole window before writing it.
template <typename Storage>
RowKernel<Storage> reordering_row_kernel(Style style);

// The kernel for a contiguous row (wide_rows.cpp): the fastest this processor
// runs; nullptr when none applies (float32 without AVX-512, fp16/bf16 with
// rotary_dim > kMaxWidenedDim without it), and the Eigen kernel then takes the row.
template <typename Storage>
RowKernel<Storage> wide_row_kernel(Style style, int64_t rotary_dim);

}  // namespace rope::cpu_eigen

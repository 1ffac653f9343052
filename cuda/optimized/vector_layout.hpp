#pragma once
/// @file vector_layout.hpp
/// @brief Which pairs a cuda-optimized thread rotates when it moves a *chunk* of a
/// head row as two 16-byte vectors (internal to the CUDA backends).
///
/// Host and device code both use this file: the kernel to find the cos/sin of
/// each value it holds, the host to lay out the cos/sin table the same way,
/// and the tests (plain C++, no GPU) to check it against pair_elements.
///
/// A chunk c of a row is two 16-byte vectors of W values each (W = 4 fp32,
/// 8 fp16/bf16): features [cW, cW + W) and [R/2 + cW, R/2 + cW + W), R the
/// rotary_dim. Neighbouring threads take neighbouring chunks, so each of the
/// two loads is coalesced across a warp, and both pairing styles keep every
/// pair inside one thread (no shuffles, no shared memory for the data):
///
/// - half-split (pair i = features i and i + R/2): the first vector holds the
///   x of pairs cW ... cW+W-1 and the second vector their y, in the same slots;
/// - interleaved (pair i = features 2i and 2i+1): each vector holds W/2 whole
///   pairs, x and y side by side: pairs cW/2 ... in the first, R/4 + cW/2 ...
///   in the second.
///
/// Taking the second vector half a rotary block away for interleaved rows too
/// (rather than the next W features) gives both styles the same access
/// pattern and the same number of pairs per chunk.

#include <cstdint>

#include "rope/config.hpp"
#include "rope/host_device.hpp"

namespace rope::cuda_detail {

/// @brief Values of @p Storage in one 16-byte vector (4 fp32, 8 fp16 or bf16).
/// @tparam Storage float, float16 or bfloat16.
/// @return 16 / sizeof(Storage).
template <typename Storage>
constexpr int vector_width() {
    return 16 / int(sizeof(Storage));
}

/// @brief Whether rows of @p rotary_dim rotated and @p head_dim features split into whole chunks of
/// @p width values (else cuda-optimized takes its one-pair-at-a-time path).
/// @param rotary_dim features that rotate.
/// @param head_dim features per row.
/// @param width values per 16-byte vector.
/// @return true when the pairs and the pass-through features both fill whole vectors.
inline bool splits_into_vectors(int64_t rotary_dim, int64_t head_dim, int width) {
    return (rotary_dim / 2) % width == 0 && (head_dim - rotary_dim) % width == 0;
}

/// @brief The pair whose value sits in slot @p slot (0 <= slot < width) of chunk @p chunk.
///
/// Slot p of a half-split chunk is the p-th value of both vectors; slot p of an
/// interleaved chunk is the p-th pair of the chunk, the first width/2 in the
/// first vector and the rest in the second.
/// @param style the pairing style.
/// @param width values per 16-byte vector.
/// @param chunk chunk index within the row.
/// @param slot slot within the chunk.
/// @param rotary_dim features that rotate.
/// @return the pair index, in [0, rotary_dim / 2).
ROPE_HOST_DEVICE inline int64_t vector_pair_of(Style style, int width, int64_t chunk, int slot, int64_t rotary_dim) {
    if (style == Style::half_split) return chunk * width + slot;
    const int half = width / 2;  // Pairs per vector.
    return slot < half ? chunk * half + slot : rotary_dim / 4 + chunk * half + (slot - half);
}

}  // namespace rope::cuda_detail

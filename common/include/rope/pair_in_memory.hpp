#pragma once
/// @file pair_in_memory.hpp
/// @brief One pair of one head row, rotated where it lies in memory: the inner
/// step that cpu-naive and cuda-naive share.

#include <cstdint>

#include "rope/dtype.hpp"
#include "rope/host_device.hpp"
#include "rope/rotation.hpp"
#include "rope/tensor.hpp"

namespace rope {

/// @brief Rotates pair @p pair of head row (b, h, s): reads its two features from
/// @p in, rotates them in float32 and writes them, rounded to @p Storage, to @p out.
///
/// Both features are read before either is written, so @p out may be @p in (an
/// in-place call). The arithmetic is float32 whatever the storage type.
/// @tparam Storage element type in memory: float, float16 or bfloat16.
/// @param in first element of the input tensor.
/// @param in_geometry sizes and strides of the input.
/// @param out first element of the output tensor (may equal @p in).
/// @param out_geometry sizes and strides of the output.
/// @param b sequence index.
/// @param h head index.
/// @param s token index.
/// @param pair the pair's two features (pair_elements).
/// @param cos_angle cosine of the angle, times the attention factor.
/// @param sin_angle sine of the angle, times the attention factor (negated for the inverse).
template <typename Storage>
ROPE_HOST_DEVICE inline void rotate_pair_in_memory(const Storage* in, const Geometry& in_geometry, Storage* out,
                                                   const Geometry& out_geometry, int64_t b, int64_t h, int64_t s,
                                                   PairIndex pair, float cos_angle, float sin_angle) {
    float x = to_float(in[in_geometry.offset(b, h, s, pair.first)]);
    float y = to_float(in[in_geometry.offset(b, h, s, pair.second)]);
    rotate_pair(x, y, cos_angle, sin_angle);
    out[out_geometry.offset(b, h, s, pair.first)] = from_float<Storage>(x);
    out[out_geometry.offset(b, h, s, pair.second)] = from_float<Storage>(y);
}

}  // namespace rope

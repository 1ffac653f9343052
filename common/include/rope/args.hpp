#pragma once
/// @file args.hpp
/// @brief The arguments of one RoPE call: the tensors, the positions, the direction,
/// an optional caller-supplied cos/sin table and the stream.

#include <cstdint>
#include <vector>

#include "rope/config.hpp"
#include "rope/dtype.hpp"
#include "rope/positions.hpp"
#include "rope/tensor.hpp"

namespace rope {

/// @brief A caller-supplied cos/sin table: the exchange format of serving engines
/// (vLLM's and SGLang's `cos_sin_cache`).
///
/// Row p holds, for position p, the cosines of the rotary_dim/2 pairs followed
/// by their sines: shape [rows, rotary_dim], float32. With a table, rope reads
/// cos and sin of pair i at position p from row p instead of computing them
/// from theta_i, so any frequency scaling rope does not ship can be plugged
/// in (the table already holds any attention factor). The table is the
/// rotation: the call's RopeConfig then gives only the pairing, the dimensions
/// and the axes; its base, scaling (frequencies and attention factor) and
/// precise_angles are never applied on top of the table, whatever they are.
/// make_cos_sin_cache() builds the table of a configuration. Position ids must lie
/// in [0, rows): host positions outside are a rope::Error; device ids outside
/// cannot be checked beforehand, and the CUDA backends then never read outside
/// the table: each pair whose position (on its own axis) is outside gets NaN
/// for cos and sin, so its two rotated features come out NaN (pass-through
/// features are still copied).
struct CosSinCache {
    const void* data = nullptr;    ///< Row 0; null means rope computes cos/sin itself (the default).
    DType dtype = DType::f32;      ///< Must be f32: fp16/bf16 tables lose too much (see chapter 7).
    Device device = Device::host;  ///< Where the table lives; must match the backend.
    int64_t rows = 0;              ///< Positions the table covers (max_position); > 0.
    int64_t cols = 0;              ///< Entries per row; must equal rotary_dim.
    int64_t row_stride = 0;        ///< Elements between rows; 0 means cols.

    /// @brief A dense [rows, cols] float32 table.
    /// @param data row 0 of the table.
    /// @param rows positions it covers.
    /// @param cols rotary_dim: cos of each pair, then sin of each pair.
    /// @param device where it lives.
    /// @return the table description.
    static CosSinCache dense(const float* data, int64_t rows, int64_t cols, Device device = Device::host) {
        return CosSinCache{data, DType::f32, device, rows, cols, cols};
    }
};

/// @brief Most floats a table built by make_cos_sin_cache() may hold: 2^31 (8 GiB).
inline constexpr int64_t kMaxCosSinCacheFloats = int64_t(1) << 31;

/// @brief Builds the cos/sin table of @p config in vLLM's layout (see CosSinCache).
///
/// Row p, for p in [0, rows), holds attention_factor * cos(angle(p, i)) for
/// each pair i in [0, rotary_dim/2), then attention_factor * sin(angle(p, i)):
/// theta_i and the attention factor of every scaling type come from
/// make_frequency_table(), and the angle and its cos and sin are computed by
/// the very code the backends run (rope_angle, or rope_angle_precise when
/// config.precise_angles is set), as vLLM folds the attention factor (yarn's
/// mscale, longrope's) into its table. So a call given @p config and this
/// table rotates as the same call given @p config alone: bit for bit on
/// cpu-naive, and within each backend's own cos/sin accuracy elsewhere.
/// With several position axes (M-RoPE, axial) column i holds pair i's own
/// theta_i, and each pair reads the row of its own axis's position, as vLLM's
/// M-RoPE reads its table.
///
/// Dynamic and longrope scaling have frequencies that depend on how far a
/// call reaches; the table holds those of calls whose largest position + 1 is
/// @p max_position, which must then be given (for dynamic, vLLM builds its
/// table for its full length in the same way). Calls that reach less far would
/// use other frequencies without a table (the unscaled base, the short factors).
/// @code
/// const std::vector<float> table = rope::make_cos_sin_cache(config, 4096);
/// args.cos_sin_cache = rope::CosSinCache::dense(table.data(), 4096, config.effective_rotary_dim());
/// @endcode
/// @param config the model's RoPE, any scaling type and axes.
/// @param rows positions the table covers, 0 to rows - 1 (vLLM's max_position);
///        > 0, and rows * rotary_dim at most kMaxCosSinCacheFloats.
/// @param max_position dynamic and longrope only, and required (> 0) there: the
///        largest position + 1 of the calls the table serves; >= 0 for the other
///        types, which do not read it.
/// @return rows * rotary_dim floats, row after row.
/// @throws rope::Error naming the parameter and its value: @p config invalid
///         (see validate()), @p rows or @p max_position out of range, or an
///         angle that float32 cannot hold (as a call without the table would be refused).
std::vector<float> make_cos_sin_cache(const RopeConfig& config, int64_t rows, int64_t max_position = 0);

/// @brief The arguments of one RoPE call: q and k in, q and k out.
///
/// Outputs may be the inputs themselves (in place: same pointer, same
/// strides) or separate tensors; a partial overlap is rejected. k may have
/// fewer heads than q (grouped-query attention) or none at all (rotate q only).
struct RopeArgs {
    TensorView q;      ///< Queries to rotate.
    TensorView k;      ///< Keys to rotate; same batch, seq and head_dim as q.
    TensorView q_out;  ///< Where rotated q goes (may equal q).
    TensorView k_out;  ///< Where rotated k goes (may equal k).
    Positions positions{};                     ///< Position of each token.
    Direction direction = Direction::forward;  ///< Forward or inverse rotation.
    void* stream = nullptr;  ///< CUDA backends: the cudaStream_t to issue work on (null: default stream).
    CosSinCache cos_sin_cache{};  ///< A caller's cos/sin table (data null: computed from the config).

    /// @brief In-place call: q and k are overwritten with their rotation.
    /// @param q queries, input and output.
    /// @param k keys, input and output (may have no heads: rotate q only).
    /// @param positions position of each token (default 0, 1, ..., seq-1).
    /// @param direction forward or inverse rotation.
    /// @return the arguments, with q_out = q, k_out = k and the default stream.
    static RopeArgs in_place(TensorView q, TensorView k, Positions positions = {},
                             Direction direction = Direction::forward) {
        return RopeArgs{q, k, q, k, positions, direction, nullptr, {}};
    }
    /// @brief Out-of-place call: the rotation of q and k is written to q_out and k_out.
    /// @param q queries to rotate (left unchanged).
    /// @param k keys to rotate (left unchanged).
    /// @param q_out where rotated q goes; same sizes as q.
    /// @param k_out where rotated k goes; same sizes as k.
    /// @param positions position of each token (default 0, 1, ..., seq-1).
    /// @param direction forward or inverse rotation.
    /// @return the arguments, with the default stream.
    static RopeArgs out_of_place(TensorView q, TensorView k, TensorView q_out, TensorView k_out,
                                 Positions positions = {}, Direction direction = Direction::forward) {
        return RopeArgs{q, k, q_out, k_out, positions, direction, nullptr, {}};
    }
};

}  // namespace rope

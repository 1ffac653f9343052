#pragma once
/// @file plan.hpp
/// @brief A validated RoPE call, reduced to what a backend loop needs.

#include <cstdint>

#include "rope/config.hpp"
#include "rope/frequency_table.hpp"
#include "rope/positions.hpp"
#include "rope/tensor.hpp"

namespace rope {

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
    Positions positions{};                   ///< Position of each token.
    Direction direction = Direction::forward;  ///< Forward or inverse rotation.
    void* stream = nullptr;  ///< CUDA backends: the cudaStream_t to issue work on (null: default stream).

    /// @brief In-place call: q and k are overwritten with their rotation.
    /// @param q queries, input and output.
    /// @param k keys, input and output (may have no heads: rotate q only).
    /// @param positions position of each token (default 0, 1, ..., seq-1).
    /// @param direction forward or inverse rotation.
    /// @return the arguments, with q_out = q, k_out = k and the default stream.
    static RopeArgs in_place(TensorView q, TensorView k, Positions positions = {},
                             Direction direction = Direction::forward) {
        return RopeArgs{q, k, q, k, positions, direction, nullptr};
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
        return RopeArgs{q, k, q_out, k_out, positions, direction, nullptr};
    }
};

/// @brief Where the position of token (b, s) comes from, in a form device code can read.
struct PositionSource {
    int64_t offset = 0;           ///< Used when ids is null.
    const int64_t* ids = nullptr; ///< Explicit ids, or null.
    int64_t row_stride = 0;       ///< 0 when one id row is shared by the batch, else seq.

    /// @brief Position of token @p s of sequence @p b.
    /// @param b sequence index (ignored when one id row is shared, or without ids).
    /// @param s token index within the sequence.
    /// @return ids[b * row_stride + s] when ids are given, else offset + s.
    ROPE_HOST_DEVICE int64_t at(int64_t b, int64_t s) const {
        return ids ? ids[b * row_stride + s] : offset + s;
    }
};

/// @brief One tensor operand of a plan: input pointer, output pointer and both geometries.
struct Operand {
    const void* in = nullptr;  ///< Input elements.
    void* out = nullptr;       ///< Output elements (equal to in for an in-place call).
    Geometry in_geometry;      ///< Sizes and strides of the input.
    Geometry out_geometry;     ///< Sizes and strides of the output (same sizes).
};

/// @brief A RoPE call after validation: everything checked, nothing left to derive.
///
/// Backends receive a Plan and only loop over it; they never see unvalidated
/// input, so every backend rejects bad input identically.
struct Plan {
    Style style = Style::half_split;  ///< Pairing of features.
    Direction direction = Direction::forward;  ///< Sign of the angle.
    DType dtype = DType::f32;         ///< Storage type of all four tensors.
    Device device = Device::host;     ///< Where all tensors and ids live.
    int64_t batch = 0;       ///< Sequences.
    int64_t seq = 0;         ///< Tokens per sequence.
    int64_t head_dim = 0;    ///< Features per head.
    int64_t rotary_dim = 0;  ///< Features that rotate (even, <= head_dim).
    int64_t pairs = 0;       ///< rotary_dim / 2.
    Operand q;               ///< Queries.
    Operand k;               ///< Keys (k.in_geometry.heads may be 0).
    PositionSource positions;  ///< Position of each token.
    FrequencyTable frequencies;  ///< theta_i and the attention factor.
    bool precise_angles = false; ///< Use rope_angle_precise with frequencies.inv_freq_exact.
    void* stream = nullptr;  ///< CUDA stream, if any.

    /// @brief Whether there is nothing to do.
    /// @return true when batch or seq is zero, or neither q nor k has a head.
    bool empty() const { return batch == 0 || seq == 0 || (q.in_geometry.heads == 0 && k.in_geometry.heads == 0); }
};

/// @brief Validates @p args against @p config for a backend on @p device and builds the Plan.
/// @param config the model's RoPE (validated first, as validate() does).
/// @param args the tensors, positions, direction and stream of the call.
/// @param device where the backend runs: every non-empty tensor and the position ids must live there.
/// @return the plan, with its frequency table computed for the call's largest position.
/// @throws rope::Error naming the first offending parameter and its value.
Plan make_plan(const RopeConfig& config, const RopeArgs& args, Device device);

}  // namespace rope

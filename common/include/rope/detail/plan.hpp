#pragma once
/// @file detail/plan.hpp
/// @brief For backend authors: a validated RoPE call, reduced to what a backend loop needs.
///
/// Users never need this header: rope::apply() builds the Plan and hands it to
/// the backend. Everything a backend would otherwise derive for itself is
/// derived here once (the frequency table, the scales of cos and sin, where
/// each token's position comes from), so every backend loops over the same
/// facts and rejects bad input identically.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "rope/args.hpp"
#include "rope/config.hpp"
#include "rope/frequency_table.hpp"
#include "rope/host_device.hpp"
#include "rope/positions.hpp"
#include "rope/tensor.hpp"

namespace rope {

class Backend;  // rope/backend.hpp

/// @brief Where the position of token (b, s) on each axis comes from, in a form
/// device code can read (pointers, no containers).
///
/// One of three sources: explicit ids; packed sequences (cu_seqlens, with a
/// binary search for the token's sequence); or an offset. The packed and
/// offset forms may be context-parallel shards (cp_size > 1), whose local
/// token index is first mapped to the global one. PositionSource adds, for a
/// re-rotation, a second form: the positions the keys turn from.
struct PositionForm {
    int64_t offset = 0;              ///< Offset form: first position (packed form: start when starts is null).
    const int64_t* ids = nullptr;    ///< Explicit ids [axes][rows][seq], or null.
    int64_t axis_stride = 0;         ///< Ids between consecutive axis rows.
    int64_t row_stride = 0;          ///< Ids between sequences: 0 when one row is shared, else seq.
    const int64_t* cu_seqlens = nullptr;  ///< Packed form: sequence boundaries [sequences + 1], or null.
    const int64_t* starts = nullptr;      ///< Packed form: first position of each sequence, or null.
    int64_t sequences = 0;           ///< Packed form: number of sequences.
    int64_t cp_size = 1;             ///< Context-parallel group size (1: unsharded).
    int64_t cp_rank = 0;             ///< This rank.
    int64_t seq = 0;                 ///< Tokens per sequence of the tensors (the offset form's local length).

    /// @brief Whether sequences of the batch have positions of their own (per-sequence ids).
    /// @return true when ids are given per sequence.
    ROPE_HOST_DEVICE bool per_sequence() const { return ids != nullptr && row_stride != 0; }

    /// @brief Global index of local token @p local of a sequence of @p length local tokens
    /// on this context-parallel rank: chunk cp_rank, then chunk 2*cp_size-1-cp_rank.
    /// @param local token index within this rank's part of the sequence.
    /// @param length tokens of the sequence on this rank (two chunks of length/2).
    /// @return the token's index in the unsharded sequence.
    ROPE_HOST_DEVICE int64_t global_index(int64_t local, int64_t length) const {
        if (cp_size == 1) return local;
        const int64_t chunk = length / 2;
        return local < chunk ? cp_rank * chunk + local : (2 * cp_size - 1 - cp_rank) * chunk + (local - chunk);
    }

    /// @brief Packed form: the sequence that token @p t belongs to, by binary search.
    ///
    /// Reads only cu_seqlens[1 .. sequences-1], whatever they hold (device
    /// arrays are not validated), so the answer is always in [0, sequences).
    /// @param t token index in the pack.
    /// @return b with cu_seqlens[b] <= t < cu_seqlens[b + 1] for valid cu_seqlens.
    ROPE_HOST_DEVICE int64_t sequence_of(int64_t t) const {
        int64_t low = 0, high = sequences - 1;
        while (low < high) {
            const int64_t middle = (low + high + 1) / 2;
            if (cu_seqlens[middle] <= t) low = middle;
            else high = middle - 1;
        }
        return low;
    }

    /// @brief Position of token @p s of sequence @p b on axis @p axis.
    /// @param b sequence index (0 for packed tensors).
    /// @param s token index within the sequence (packed: within the pack).
    /// @param axis position axis, e.g. AngleRule::pair_axis[i] for pair i: only explicit
    ///        ids have several rows (make_plan checks they have the config's count);
    ///        the offset and packed forms give every axis the same position (text tokens).
    /// @return the position id.
    ROPE_HOST_DEVICE int64_t at(int64_t b, int64_t s, int64_t axis = 0) const {
        if (ids != nullptr) return ids[axis * axis_stride + b * row_stride + s];
        if (cu_seqlens != nullptr) {
            const int64_t sequence = sequence_of(s);
            const int64_t first = cu_seqlens[sequence];
            const int64_t start = starts != nullptr ? starts[sequence] : offset;
            return start + global_index(s - first, cu_seqlens[sequence + 1] - first);
        }
        return offset + global_index(s, seq);
    }
};

/// @brief The positions a call turns its tokens by: one PositionForm, or for a
/// re-rotation (rope/rerotate.hpp) the difference of two.
///
/// A re-rotation turns each key by angle(to) - angle(from); with one frequency
/// table that is (to - from) * theta_i exactly, so at() gives the signed
/// difference to - from (negative when a key moves back) and the backends
/// rotate by it as by any position. Only the precise angle path
/// (rope_angle_precise, which takes any int64) can then run: make_plan never
/// sets `relative`, and the plan of a re-rotation forces precise angles.
struct PositionSource : PositionForm {
    PositionForm from;      ///< Re-rotation: the positions the keys turn from (read only when relative).
    bool relative = false;  ///< True for a re-rotation: at() is the form's position minus from's.

    /// @brief Whether sequences of the batch have positions of their own (per-sequence ids, either form).
    /// @return true when ids are given per sequence.
    ROPE_HOST_DEVICE bool per_sequence() const {
        return PositionForm::per_sequence() || (relative && from.per_sequence());
    }

    /// @brief Whether any axis row of a token may differ from row 0 (explicit ids in either form).
    /// @return true when a token's axes must each be read.
    ROPE_HOST_DEVICE bool has_ids() const { return ids != nullptr || (relative && from.ids != nullptr); }

    /// @brief The position (re-rotation: the position difference) of token @p s of sequence @p b
    /// on axis @p axis.
    /// @tparam kMayBeRelative false where the caller knows the source is not relative (the default
    ///         angle path, which a re-rotation never takes): the plain form's position, without the branch.
    /// @param b sequence index (0 for packed tensors).
    /// @param s token index within the sequence (packed: within the pack).
    /// @param axis position axis (see PositionForm::at).
    /// @return the position id, or to - from for a re-rotation.
    template <bool kMayBeRelative = true>
    ROPE_HOST_DEVICE int64_t at(int64_t b, int64_t s, int64_t axis = 0) const {
        const int64_t position = PositionForm::at(b, s, axis);
        if constexpr (kMayBeRelative) {
            if (relative) return position - from.at(b, s, axis);
        }
        return position;
    }
};

/// @brief A caller's cos/sin table as the kernels read it (CosSinCache, validated).
struct CosSinTable {
    const float* data = nullptr;  ///< Row 0, or null: cos/sin are computed.
    int64_t rows = 0;             ///< Positions covered.
    int64_t row_stride = 0;       ///< Floats between rows.
    int64_t pairs = 0;            ///< Sines start this many floats into a row.
};

/// @brief One tensor operand of a plan: input pointer, output pointer and both geometries.
struct Operand {
    const void* in = nullptr;  ///< Input elements.
    void* out = nullptr;       ///< Output elements (equal to in for an in-place call).
    Geometry in_geometry;      ///< Sizes and strides of the input.
    Geometry out_geometry;     ///< Sizes and strides of the output (same sizes).
};

/// @brief What turns (position, pair) into cos and sin for one call: the
/// frequencies, the mode, the scales, or a caller's table. See rotation_factors().
struct AngleRule {
    std::vector<float> inv_freq;      ///< theta_i in float32 (FrequencyTable::inv_freq).
    std::vector<float> inv_freq_low;  ///< Low parts, for the precise mode (FrequencyTable::inv_freq_low).
    std::vector<uint8_t> pair_axis;   ///< Position axis of each pair (FrequencyTable::pair_axis).
    bool precise = false;             ///< RopeConfig::precise_angles.
    float cos_scale = 1.0f;           ///< attention_factor (1 with a caller's table).
    float sin_scale = 1.0f;           ///< attention_factor, negated for the inverse rotation.
    CosSinTable table;                ///< A caller's table, or none.
};

/// @brief A RoPE call after validation: everything checked, nothing left to derive.
///
/// Backends receive a Plan and only loop over it; they never see unvalidated
/// input, so every backend rejects bad input identically.
struct Plan {
    /// Pairing of features: the config's, except for the inverse of a reordering style
    /// (Style::interleaved_to_half and half_to_interleaved), which runs as the other one.
    Style style = Style::half_split;
    DType dtype = DType::f32;         ///< Storage type of all four tensors.
    Device device = Device::host;     ///< Where all tensors and position arrays live.
    int64_t batch = 0;       ///< Sequences (1 for packed tensors).
    int64_t seq = 0;         ///< Tokens per sequence (packed: total tokens).
    int64_t head_dim = 0;    ///< Features per head.
    int64_t rotary_dim = 0;  ///< Features that rotate (even, <= head_dim).
    int64_t pairs = 0;       ///< rotary_dim / 2.
    /// First rotated feature (RopeConfig::rotary_offset). Backends only ever run
    /// plans with 0 here: run_plan cuts a plan with a window into window_parts().
    int64_t rotary_offset = 0;
    int64_t axes = 1;        ///< Position axes of each token.
    Operand q;               ///< Queries.
    Operand k;               ///< Keys (k.in_geometry.heads may be 0).
    PositionSource positions;  ///< Position of each token on each axis.
    AngleRule angles;        ///< cos and sin of each pair at a position.
    void* stream = nullptr;  ///< CUDA stream, if any.

    /// @brief Whether there is nothing to do.
    /// @return true when batch or seq is zero, or neither q nor k has a head.
    bool empty() const { return batch == 0 || seq == 0 || (q.in_geometry.heads == 0 && k.in_geometry.heads == 0); }
};

/// @brief Validates @p args against @p config for a backend on @p device and builds the Plan.
/// @param config the model's RoPE (validated first, as validate() does).
/// @param args the tensors, positions, direction, table and stream of the call.
/// @param device where the backend runs: every non-empty tensor and position array must live there.
/// @param frequencies the table of @p config that every call shares (reusable_frequency_table()), built
/// once by a caller that makes many calls with one configuration; null, or a configuration whose table
/// depends on the call (dynamic, longrope): built here for the call.
/// @return the plan, with its frequency table computed for the call's largest position
/// (an empty call, which no backend runs, gets none).
/// @throws rope::Error naming the first offending parameter and its value.
Plan make_plan(const RopeConfig& config, const RopeArgs& args, Device device,
               const FrequencyTable* frequencies = nullptr);

namespace detail {
/// @brief What make_plan learns about one Positions argument (see check_positions).
struct PositionFacts {
    PositionForm source;       ///< The positions, in the form the backends read.
    int64_t max_position = 0;  ///< For length-dependent scaling: HF's max(position_ids) + 1.
    int64_t largest = -1;      ///< Largest position when rope can see every one (host arrays, offsets), else -1.
};

/// @brief make_plan's checks of one Positions argument, for calls that take several
/// (rope::rerotate's from and to).
/// @param name the argument's name in messages ("positions", "from", "to").
/// @param positions the positions to check.
/// @param batch the tensors' batch.
/// @param seq the tensors' seq.
/// @param device where the backend runs.
/// @param config the call's (valid) configuration: its axes and scaling.
/// @param table whether the call brings a caller's cos/sin table.
/// @return the positions as the backends read them, and their extent.
/// @throws rope::Error naming the first offending field (e.g. from.ids[3]) and its value.
PositionFacts check_positions(std::string_view name, const Positions& positions, int64_t batch, int64_t seq,
                              Device device, const RopeConfig& config, bool table);

/// @brief make_plan, naming the positions @p positions_name in its messages (rope::rerotate's "to").
/// @param config the model's RoPE.
/// @param args the call.
/// @param device where the backend runs.
/// @param frequencies as make_plan's.
/// @param positions_name the name of args.positions in messages.
/// @return the plan.
/// @throws rope::Error naming the first offending parameter and its value.
Plan make_plan(const RopeConfig& config, const RopeArgs& args, Device device, const FrequencyTable* frequencies,
               std::string_view positions_name);

/// @brief make_frequency_table() for a configuration already validated (make_plan's use).
/// @param config a valid configuration.
/// @param max_position largest position of the call + 1.
/// @return the frequency table.
FrequencyTable build_frequency_table(const RopeConfig& config, int64_t max_position);

/// @brief The frequency table of @p config that every call can share, for make_plan's
/// @p frequencies: theta_i computed once per configuration instead of once per call.
/// @param config the model's RoPE (validated first, as validate() does).
/// @return its table, or std::nullopt when it depends on the call's positions (dynamic and
/// longrope scaling read the call's largest position).
/// @throws rope::Error if @p config is invalid.
std::optional<FrequencyTable> reusable_frequency_table(const RopeConfig& config);

/// @brief A plan whose rotary window starts past feature 0, as plans that every backend
/// runs unchanged: features [0, rotary_offset) copied (a plan with rotary_dim 0, for the
/// operands not rotated in place, whose features already are where they belong), then
/// features [rotary_offset, head_dim) rotated as a plan of its own whose rows start at
/// the window (pointers moved on, head_dim shortened), so that its window starts at 0.
/// @param plan a plan from make_plan.
/// @return @p plan itself when its rotary_offset is 0; else the copy (when needed) and the window.
std::vector<Plan> window_parts(const Plan& plan);
/// @brief Refuses what only rope::apply's row loop runs: a rotary window (RopeConfig::rotary_offset)
/// and the reordering styles (Style::interleaved_to_half, half_to_interleaved), for the fused calls
/// whose backends loop over pairs themselves (rope::append_kv, rope::apply_qk_norm).
/// @param config the call's configuration.
/// @param call the entry point, for the message (e.g. "append_kv").
/// @throws rope::Error naming config.rotary_offset or config.style and its value.
void refuse_window_and_reordering(const RopeConfig& config, std::string_view call);

/// @brief rope::apply after make_plan: refuses a plan beyond @p backend's limits
/// (rope::BackendLimits), skips an empty one, runs the rest (a rotary window as its window_parts()).
/// @param backend the backend the plan was built for (make_plan with its device()).
/// @param plan the validated call.
/// @throws rope::Error naming the parameter beyond the backend's limits.
void run_plan(Backend& backend, const Plan& plan);
}  // namespace detail

}  // namespace rope

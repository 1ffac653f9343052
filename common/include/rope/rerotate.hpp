#pragma once
/// @file rerotate.hpp
/// @brief Re-rotation of keys that are already rotated: from positions `from` to positions `to`
/// in one rotation by the angle difference (KV eviction with attention sinks, window shifts,
/// context compaction).

#include "rope/backend.hpp"
#include "rope/config.hpp"
#include "rope/dtype.hpp"
#include "rope/kv_append.hpp"
#include "rope/positions.hpp"
#include "rope/tensor.hpp"

namespace rope {

/// @brief The arguments of one re-rotation: keys rotated at `from`, turned to `to`.
///
/// k is any view rope::apply takes (bhsd, bshd, thd, strided, fp32, fp16,
/// bf16); k_out may be k itself (in place) or a separate tensor of the same
/// sizes. `from` and `to` are each any form Positions has (an offset, ids
/// shared or per sequence, packed sequences, context-parallel shards,
/// M-RoPE or axial ids), checked against k as rope::apply checks positions
/// against its tensors; the two need not have the same form.
struct RerotateArgs {
    TensorView k;           ///< Keys rotated at positions `from`.
    TensorView k_out;       ///< Where the keys rotated at positions `to` go (may equal k).
    Positions from{};       ///< The positions k is rotated at now.
    Positions to{};         ///< The positions k is to be rotated at.
    void* stream = nullptr; ///< CUDA backends: the cudaStream_t to issue work on (null: default stream).

    /// @brief In-place re-rotation: k is overwritten with its keys at positions @p to.
    /// @param k keys rotated at @p from; input and output.
    /// @param from the positions k is rotated at.
    /// @param to the positions to rotate it to.
    /// @return the arguments, with k_out = k and the default stream.
    static RerotateArgs in_place(TensorView k, Positions from, Positions to) {
        return RerotateArgs{k, k, from, to, nullptr};
    }
    /// @brief Out-of-place re-rotation: k's keys at positions @p to are written to @p k_out.
    /// @param k keys rotated at @p from (left unchanged).
    /// @param k_out where the re-rotated keys go; same sizes as k.
    /// @param from the positions k is rotated at.
    /// @param to the positions to rotate it to.
    /// @return the arguments, with the default stream.
    static RerotateArgs out_of_place(TensorView k, TensorView k_out, Positions from, Positions to) {
        return RerotateArgs{k, k_out, from, to, nullptr};
    }
};

/// @brief Turns keys rotated at positions `from` into keys rotated at positions `to`,
/// as one rotation by angle(to) - angle(from).
///
/// Pair i of each key turns by (to - from) * theta_i, which equals
/// angle(to) - angle(from) exactly for one frequency table. The angle is the
/// precise mode's (rope_angle_precise: the product in double, reduced to
/// [-pi, pi] in double, then rounded to float32), whatever
/// config.precise_angles says: the difference is formed before any rounding,
/// so one re-rotation costs one rotation's error, however far the keys move
/// and however often they were moved before. Successive corrections instead
/// add one rounding of the angle and of the stored keys each.
///
/// The rotation is never scaled: keys rotated by rope::apply already carry
/// the attention factor (yarn's mscale, longrope's), and a re-rotation keeps
/// it. So re-rotating keys rotated at `from` gives, up to rounding, the raw
/// keys rotated at `to`, for any scaling; `to` all zero gives the raw keys
/// times the attention factor (the inverse of the rotation, R(-angle(from))).
/// Features past the rotary part pass through untouched.
///
/// Dynamic and longrope scaling choose their frequencies by how far a call
/// reaches. A re-rotation takes them when `from` and `to` give the same
/// frequencies (both within original_max_position_embeddings, or both
/// reaching equally far), or when one side is all position 0 (its angle is 0
/// whatever the frequencies: the inverse, or rotating raw keys); otherwise it
/// refuses (LongRoPE's switch from short to long factors is no rotation by a
/// position difference): undo the rotation with rope::apply
/// (Direction::inverse, at `from`), then rotate at `to` with rope::apply.
/// A caller's cos/sin table is not taken: a table holds cos and sin of
/// float32 angles, whose difference would not be formed before rounding.
/// @param backend the backend that runs the call; its device() must be where k, k_out and
///        every position array live.
/// @param config the model's RoPE: pairing style, dimensions, base, scaling, axes.
/// @param args the keys, the two positions and the stream.
/// @throws rope::Error naming the offending parameter and its value (k head_dim, k_out
/// sizes, from.ids[3], to.length, scaling.type, ...); nothing is written then.
void rerotate(Backend& backend, const RopeConfig& config, const RerotateArgs& args);

/// @brief The arguments of one re-rotation of keys held in a paged cache (rope::rerotate_cache).
///
/// Entry t (t < slot_mapping.count) names the cache slot slot_mapping.slots[t]
/// (as rope::append_kv names it: page * page_size + slot in page; < 0 skips the
/// entry) and the positions from[t] and to[t] of its keys. `from` and `to` are
/// positions of one sequence of slot_mapping.count tokens (any form Positions
/// has with batch 1: an offset, ids, packed sequences, M-RoPE ids).
struct RerotateCacheArgs {
    PagedCache k_cache;          ///< The key cache, model dtype only; its rows at the named slots are turned in place.
    DType dtype = DType::f32;    ///< The dtype of the cache's elements (the model's: fp32, fp16 or bf16).
    SlotMapping slot_mapping{};  ///< The slots of the entries to turn (slots < 0: skipped).
    Positions from{};            ///< The positions each entry's keys are rotated at now.
    Positions to{};              ///< The positions each entry's keys are to be rotated at.
    void* stream = nullptr;      ///< CUDA backends: the cudaStream_t to issue work on (null: default stream).
};

/// @brief rope::rerotate for keys held in a paged cache: the rows of the slots
/// a slot mapping names, turned in place from positions `from` to positions `to`.
///
/// Entry t with a slot s >= 0 turns every head row of slot s exactly as
/// rope::rerotate turns token t of a key tensor: one rotation by the precise
/// angle difference, unscaled, features past the rotary part untouched, the
/// same refusals for dynamic and longrope scaling. The cache's other rows keep
/// their bits. The use: after an eviction or a window shift, the kept keys move
/// to new positions without leaving the cache (StreamingLLM's sinks, context
/// compaction).
///
/// Host slots are checked as rope::append_kv checks them (each below
/// pages * page_size, no slot twice); device slots cannot be read without a
/// copy, and an out-of-range device slot is skipped (nothing written for it).
/// Where two entries share a device slot the row is turned twice, in an
/// unspecified interleaving: give each slot once. An FP8 cache is refused
/// (k_cache.dtype): turning it would dequantise and quantise again, rounding
/// twice.
/// @param backend the backend that runs the call; its device() is where the cache, the slots and
///        every position array live.
/// @param config the model's RoPE.
/// @param args the cache, its dtype, the slots, the two positions and the stream.
/// @throws rope::Error naming the offending parameter and its value (k_cache.dtype,
/// k_cache.head_dim, slot_mapping.slots[3], to.length, scaling.type, ...); nothing is written then.
void rerotate_cache(Backend& backend, const RopeConfig& config, const RerotateCacheArgs& args);

}  // namespace rope

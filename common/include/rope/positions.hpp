#pragma once
/// @file positions.hpp
/// @brief Which position each token has: one line, packed sequences, context-parallel
/// shards, or several axes (M-RoPE, axial vision RoPE).

#include <cstdint>

#include "rope/tensor.hpp"

namespace rope {

/// @brief The position ids of the tokens being rotated.
///
/// The forms, and what each models:
/// - the default, positions 0, 1, ..., seq-1 (a prompt processed from the start);
/// - a start offset, positions offset, ..., offset+seq-1 (decoding with a KV
///   cache that already holds `offset` tokens);
/// - explicit ids, int64: one row of `seq` ids shared by the batch (shape
///   [seq]) or one row per sequence (shape [batch, seq]);
/// - multi-axis ids (`axes` > 1): shape [axes, seq] or [axes, batch, seq],
///   one row per axis (M-RoPE: temporal, height, width; axial RoPE: one
///   coordinate per image or video axis). RopeConfig::multi_axis says which
///   pair turns with which axis;
/// - packed sequences (`cu_seqlens`): the tokens of several sequences
///   concatenated into one (Layout::thd, or any view with batch 1); token t of
///   sequence b has position t - cu_seqlens[b] + starts[b] (starts[b] = offset
///   when `starts` is null);
/// - context-parallel shards (`cp_size` > 1), with the offset or packed form:
///   this rank holds chunks cp_rank and 2*cp_size-1-cp_rank of every sequence
///   (each of half its local length L), so local token j has global index
///   cp_rank*L/2 + j for j < L/2 and (2*cp_size-1-cp_rank)*L/2 + j - L/2 after:
///   the load-balanced split of TransformerEngine and Megatron-LM.
///
/// Ids, cu_seqlens and starts live on the backend's device. Host ones are
/// checked element by element; device ones cannot be read without a copy, so
/// only their shapes are checked, and the kernels stay in bounds whatever they
/// contain (see docs/api.md).
struct Positions {
    int64_t offset = 0;           ///< First position when `ids` is null (with cu_seqlens: each sequence's start when `starts` is null).
    const int64_t* ids = nullptr; ///< Explicit position ids, or null.
    int64_t axes = 1;             ///< Id rows per token: 1, or the config's axis count (M-RoPE: 3).
    int64_t rows = 0;             ///< Sequences with ids of their own: 1 (shared) or batch.
    int64_t length = 0;           ///< Ids per row; must equal the tensors' seq.
    /// Packed sequences: `sequences` + 1 int64 offsets, 0 first, non-decreasing,
    /// last = total tokens. Null: the tensors' own batch and seq axes say where
    /// each sequence is.
    const int64_t* cu_seqlens = nullptr;
    int64_t sequences = 0;         ///< Sequences in the pack (cu_seqlens has sequences + 1 entries).
    const int64_t* starts = nullptr;  ///< Packed sequences: the first position of each, [sequences]; null: offset.
    int64_t cp_size = 1;          ///< Context-parallel ranks the sequences are split over (1: no split).
    int64_t cp_rank = 0;          ///< This rank, in [0, cp_size).
    Device device = Device::host; ///< Where ids, cu_seqlens and starts live; must match the backend.
    /// Largest position + 1, needed only for length-dependent scaling (dynamic
    /// NTK, longrope) when the ids or cu_seqlens live on a device, where rope
    /// cannot read them without a hidden copy. 0 means unknown. Ignored when
    /// rope can compute it (host arrays, offsets).
    int64_t max_position = 0;

    /// @brief Positions offset, offset+1, ...: the default when @p offset is 0.
    /// @param offset first position, e.g. the tokens already in the KV cache; must be >= 0.
    /// @return positions without explicit ids.
    static Positions starting_at(int64_t offset) {
        Positions positions;
        positions.offset = offset;
        return positions;
    }
    /// @brief One row of @p length ids shared by every sequence of the batch.
    /// @param ids the ids, shape [length]; each must be >= 0.
    /// @param length ids in the row; must equal the tensors' seq.
    /// @param device where @p ids lives; must match the backend.
    /// @return positions with rows = 1 (max_position unknown: set it for device ids if needed).
    static Positions shared(const int64_t* ids, int64_t length, Device device = Device::host) {
        return per_sequence(ids, 1, length, device);
    }
    /// @brief A [rows, length] row-major table of ids, one row per sequence.
    /// @param ids the ids, shape [rows, length]; each must be >= 0.
    /// @param rows rows of the table; must equal the batch (or be 1).
    /// @param length ids per row; must equal the tensors' seq.
    /// @param device where @p ids lives; must match the backend.
    /// @return positions with explicit ids (max_position unknown: set it for device ids if needed).
    static Positions per_sequence(const int64_t* ids, int64_t rows, int64_t length, Device device = Device::host) {
        return multi_axis(ids, 1, rows, length, device);
    }
    /// @brief Ids with one row per axis: shape [axes, rows, length], row-major.
    ///
    /// M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): axes = 3, the temporal, height
    /// and width position of each token (text tokens have three equal ones).
    /// Axial RoPE: one coordinate per axis of each patch.
    /// @param ids the ids; each must be >= 0.
    /// @param axes rows per token; must equal the config's axis count.
    /// @param rows 1 (shared by the batch) or batch.
    /// @param length ids per row; must equal the tensors' seq.
    /// @param device where @p ids lives; must match the backend.
    /// @return positions with explicit multi-axis ids.
    static Positions multi_axis(const int64_t* ids, int64_t axes, int64_t rows, int64_t length,
                                Device device = Device::host) {
        Positions positions;
        positions.ids = ids;
        positions.axes = axes;
        positions.rows = rows;
        positions.length = length;
        positions.device = device;
        return positions;
    }
    /// @brief Packed (varlen) sequences: token t of sequence b has position
    /// t - cu_seqlens[b] + starts[b].
    /// @param cu_seqlens @p sequences + 1 offsets: 0 first, non-decreasing, last = total tokens.
    /// @param sequences number of sequences in the pack.
    /// @param starts first position of each sequence, [sequences] (null: every sequence starts at 0).
    /// @param device where @p cu_seqlens and @p starts live; must match the backend.
    /// @return positions for a thd tensor (or any view with batch 1).
    static Positions packed(const int64_t* cu_seqlens, int64_t sequences, const int64_t* starts = nullptr,
                            Device device = Device::host) {
        Positions positions;
        positions.cu_seqlens = cu_seqlens;
        positions.sequences = sequences;
        positions.starts = starts;
        positions.device = device;
        return positions;
    }
    /// @brief These positions, as seen by rank @p rank of a context-parallel group of @p size.
    ///
    /// The tensors hold this rank's shard: chunks @p rank and 2*size-1-@p rank
    /// of every sequence (both of equal length, so every local sequence length
    /// is even); the rotation uses the global positions. Works with the offset
    /// and packed forms (ids are global positions already).
    /// @param size ranks in the group, >= 1.
    /// @param rank this rank, in [0, size).
    /// @return a copy with cp_size and cp_rank set.
    Positions sharded(int64_t size, int64_t rank) const {
        Positions positions = *this;
        positions.cp_size = size;
        positions.cp_rank = rank;
        return positions;
    }
};

}  // namespace rope

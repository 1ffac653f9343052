#pragma once
/// @file positions.hpp
/// @brief Which position each token of the sequence has.

#include <cstdint>

#include "rope/tensor.hpp"

namespace rope {

/// @brief The position ids of the tokens being rotated.
///
/// Three forms cover what models do:
/// - the default, positions 0, 1, ..., seq-1 (a prompt processed from the start);
/// - a start offset, positions offset, ..., offset+seq-1 (decoding with a KV cache
///   that already holds `offset` tokens);
/// - explicit ids, int64, either one row of `seq` ids shared by the whole batch
///   (shape [seq]) or one row per sequence (shape [batch, seq]) as in padded
///   or packed batches.
struct Positions {
    int64_t offset = 0;           ///< First position when `ids` is null.
    const int64_t* ids = nullptr; ///< Explicit position ids, or null for offset + s.
    int64_t rows = 0;             ///< Rows of `ids`: 1 (shape [seq]) or batch (shape [batch, seq]).
    int64_t length = 0;           ///< Ids per row; must equal the tensors' seq.
    Device device = Device::host; ///< Where `ids` lives; must match the backend.
    /// Largest id + 1, needed only for length-dependent scaling (dynamic NTK,
    /// longrope) when `ids` live on a device, where rope cannot read them
    /// without a hidden copy. 0 means unknown. Ignored for host ids, whose
    /// maximum rope reads itself.
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
        return Positions{0, ids, 1, length, device, 0};
    }
    /// @brief A [rows, length] row-major table of ids, one row per sequence.
    /// @param ids the ids, shape [rows, length]; each must be >= 0.
    /// @param rows rows of the table; must equal the batch (or be 1).
    /// @param length ids per row; must equal the tensors' seq.
    /// @param device where @p ids lives; must match the backend.
    /// @return positions with explicit ids (max_position unknown: set it for device ids if needed).
    static Positions per_sequence(const int64_t* ids, int64_t rows, int64_t length,
                                  Device device = Device::host) {
        return Positions{0, ids, rows, length, device, 0};
    }
};

}  // namespace rope

#pragma once
/// @file position_ids.hpp
/// @brief Builders of the position arrays Positions reads: packed sequences'
/// cu_seqlens, M-RoPE ids of a multimodal prompt, axial ids of an image, video
/// or latent grid, and M-RoPE's default sections.
///
/// The arrays are host vectors in the layout Positions::packed and
/// Positions::multi_axis take (int64, axis rows one after the other); copy them
/// to the device for a CUDA backend. Every builder checks its arguments and
/// throws rope::Error naming the parameter and its value.
///
/// @code
/// // Qwen2-VL: 4 text tokens, an image of 6 x 8 patches (3 x 4 tokens after the
/// // 2 x 2 merge), 3 text tokens.
/// const rope::MropePositionIds m = rope::mrope_position_ids(
///     {rope::PromptSegment::text(4), rope::PromptSegment::picture(1, 6, 8), rope::PromptSegment::text(3)});
/// // m.ids is [3, 19]; decoding continues at position 19 + m.rope_delta.
/// auto positions = rope::Positions::multi_axis(m.ids.data(), 3, 1, m.tokens);
/// @endcode

#include <cstdint>
#include <vector>

#include "rope/config.hpp"

namespace rope {

/// @brief Offsets of packed sequences: {0, l0, l0 + l1, ..., total}.
///
/// The `cu_seqlens` of Positions::packed (and of FlashAttention's varlen
/// functions): sequence b holds tokens cu_seqlens[b] <= t < cu_seqlens[b+1].
/// @param lengths tokens of each sequence, each >= 0 (an empty sequence is allowed).
/// @return lengths.size() + 1 offsets.
/// @throws rope::Error if a length is negative or the total overflows int64.
std::vector<int64_t> cu_seqlens_from_lengths(const std::vector<int64_t>& lengths);

/// @brief One run of a multimodal prompt: text tokens, or one image or video.
struct PromptSegment {
    int64_t text_tokens = 0;  ///< Text tokens of this run (0 for a picture).
    /// A picture's temporal patches (1 for an image), as HF's `image_grid_thw` /
    /// `video_grid_thw` give it; 0 for text.
    int64_t grid_t = 0;
    int64_t grid_h = 0;  ///< A picture's patch rows, before the spatial merge; 0 for text.
    int64_t grid_w = 0;  ///< A picture's patch columns, before the spatial merge; 0 for text.
    /// Temporal ids per temporal patch of a video: 1 in Qwen2-VL; Qwen2.5-VL's
    /// `tokens_per_second * second_per_grid_t` (HF's `time_interval`). >= 1.
    int64_t temporal_interval = 1;

    /// @brief A run of text tokens.
    /// @param tokens how many, >= 1.
    /// @return the segment.
    static PromptSegment text(int64_t tokens) { return {tokens, 0, 0, 0, 1}; }
    /// @brief An image (grid_t 1) or a video, by its patch grid before the merge.
    /// @param grid_t temporal patches (1 for an image).
    /// @param grid_h patch rows.
    /// @param grid_w patch columns.
    /// @param temporal_interval temporal ids per temporal patch (1: Qwen2-VL).
    /// @return the segment.
    static PromptSegment picture(int64_t grid_t, int64_t grid_h, int64_t grid_w, int64_t temporal_interval = 1) {
        return {0, grid_t, grid_h, grid_w, temporal_interval};
    }
};

/// @brief M-RoPE position ids of one prompt, and where decoding continues.
struct MropePositionIds {
    /// [3, tokens], row-major: the temporal row, then the height row, then the
    /// width row (Positions::multi_axis with axes 3 and one id row).
    std::vector<int64_t> ids;
    int64_t tokens = 0;  ///< Tokens of the prompt.
    /// HF's `rope_deltas`: (largest id + 1) - tokens. The token at index n >=
    /// tokens (the prompt counted) is at n + rope_delta on all three rows.
    int64_t rope_delta = 0;
};

/// @brief Qwen2-VL's M-RoPE ids for text and pictures, as transformers'
/// `Qwen2VLModel.get_rope_index` builds them.
///
/// A running position p starts at 0. A run of n text tokens gets p, p+1, ...,
/// p+n-1 on all three rows, and p grows by n. A picture of grid (T, H, W)
/// becomes T x (H/m) x (W/m) tokens (m = spatial_merge_size: one token per
/// m x m patches), frame by frame, each frame row by row; its token at frame f,
/// row r, column c gets (p + f * temporal_interval, p + r, p + c), and p grows by max(H, W) / m
/// (transformers 5: `current_pos += max(grid_thw[1], grid_thw[2]) //
/// spatial_merge_size`; transformers 4 continued at the largest id + 1, which is
/// the same unless a video's temporal ids pass its merged rows and columns).
/// With a temporal_interval other than 1 (Qwen2.5-VL's videos) this is
/// Qwen2_5_VLModel.get_rope_index.
/// @param segments the prompt, in order; each text run >= 1 token, each picture
///        with grid_t >= 1 and grid_h, grid_w positive multiples of spatial_merge_size.
/// @param spatial_merge_size the vision config's `spatial_merge_size`, >= 1 (2 in Qwen2-VL).
/// @return the ids [3, tokens] and rope_delta.
/// @throws rope::Error naming the segment field (e.g. `segments[1].grid_h`) or
///         spatial_merge_size, or the token count if it overflows int64.
MropePositionIds mrope_position_ids(const std::vector<PromptSegment>& segments, int64_t spatial_merge_size = 2);

/// @brief The vision tower's axial ids of one image or video: Qwen2-VL's
/// `rot_pos_emb` (transformers' `vision_utils.get_vision_position_ids`).
///
/// The patches are stored by merge windows: window after window (windows row
/// by row), each window's m x m patches row by row; every frame repeats the same
/// ids (the tower has no temporal axis).
/// @param grid_t frames (temporal patches), >= 1.
/// @param grid_h patch rows, a positive multiple of spatial_merge_size.
/// @param grid_w patch columns, a positive multiple of spatial_merge_size.
/// @param spatial_merge_size the merge window's side m, >= 1.
/// @return [2, grid_t * grid_h * grid_w]: the row ids, then the column ids (HF's [H, W] order).
/// @throws rope::Error naming the parameter.
std::vector<int64_t> vision_position_ids(int64_t grid_t, int64_t grid_h, int64_t grid_w,
                                         int64_t spatial_merge_size = 2);

/// @brief Axial ids of a grid in row-major order (the last axis fastest), e.g.
/// (frames, rows, columns) of a video diffusion model's latent.
/// @param grid the size of each axis, 1 to kMaxPositionAxes axes, each >= 1.
/// @return [axes, product of grid]: axis 0's coordinates, then axis 1's, ...
/// @throws rope::Error naming `grid` or `grid[a]`, or if the product overflows int64.
std::vector<int64_t> axial_position_ids(const std::vector<int64_t>& grid);

/// @brief M-RoPE sections scaled to @p pairs rotated pairs from the models'
/// 64 (head_dim 128): Qwen2-VL's {16, 24, 24} (contiguous) or Qwen3-VL's
/// {24, 20, 20} (interleaved).
///
/// Height and width get round(24 * pairs / 64) or round(20 * pairs / 64)
/// pairs each (at least 1, and fewer than the temporal axis would need to keep
/// one), the temporal axis the rest: 32 pairs give {8, 12, 12} (GLM-4.1V).
/// @param assignment AxisAssignment::mrope_contiguous or AxisAssignment::mrope_interleaved.
/// @param pairs rotary_dim / 2, >= 3.
/// @return the three sections, summing to pairs.
/// @throws rope::Error naming assignment or pairs.
std::vector<int64_t> default_mrope_sections(AxisAssignment assignment, int64_t pairs);

}  // namespace rope

#pragma once
/// @file tensor.hpp
/// @brief Non-owning views of q/k tensors: pointer, dtype, device, shape and strides.

#include <array>
#include <cstdint>
#include <string_view>

#include "rope/dtype.hpp"

namespace rope {

/// @brief Where a tensor's memory lives.
enum class Device {
    host,  ///< Ordinary CPU memory.
    cuda,  ///< Memory of the current CUDA device (from cudaMalloc or equivalent).
};

/// @brief Name of a device, for messages and command lines.
/// @param device the device to name.
/// @return "host" or "cuda".
constexpr std::string_view device_name(Device device) { return device == Device::host ? "host" : "cuda"; }

/// @brief Order of the axes of a q or k tensor in memory.
enum class Layout {
    bhsd,  ///< [batch, heads, seq, head_dim]: HuggingFace's layout after the transpose.
    bshd,  ///< [batch, seq, heads, head_dim]: the layout straight out of the q/k projection.
    /// [total_tokens, heads, head_dim]: packed (varlen) sequences, concatenated
    /// token after token, their boundaries given by Positions::cu_seqlens. A
    /// 3-D view: shape[3] is 1 (TensorView::packed sets it). rope treats it as
    /// one sequence of total_tokens tokens (batch 1).
    thd,
};

/// @brief Name of a layout, for messages and command lines.
/// @param layout the layout to name.
/// @return "bhsd", "bshd" or "thd".
constexpr std::string_view layout_name(Layout layout) {
    return layout == Layout::bhsd ? "bhsd" : layout == Layout::bshd ? "bshd" : "thd";
}

/// @brief Parses a layout name.
/// @param name "bhsd", "bshd" or "thd".
/// @return the matching Layout.
/// @throws rope::Error for any other name.
Layout parse_layout(std::string_view name);

/// @brief Sizes and strides of a q/k tensor in logical order (batch, heads, seq, dim),
/// whatever its layout in memory. Strides count elements, not bytes.
struct Geometry {
    int64_t batch = 0;     ///< Number of sequences.
    int64_t heads = 0;     ///< Number of attention heads.
    int64_t seq = 0;       ///< Tokens per sequence.
    int64_t head_dim = 0;  ///< Elements per head row.
    int64_t stride_batch = 0;  ///< Elements between consecutive sequences.
    int64_t stride_head = 0;   ///< Elements between consecutive heads.
    int64_t stride_seq = 0;    ///< Elements between consecutive tokens.
    int64_t stride_dim = 0;    ///< Elements between consecutive features (1 when rows are contiguous).

    /// @brief Element offset of (b, h, s, d) from the start of the tensor.
    /// @param b sequence index.
    /// @param h head index.
    /// @param s token index.
    /// @param d feature index.
    /// @return the offset in elements (not bytes): the dot product of the indices with the strides.
    ROPE_HOST_DEVICE int64_t offset(int64_t b, int64_t h, int64_t s, int64_t d) const {
        return b * stride_batch + h * stride_head + s * stride_seq + d * stride_dim;
    }
    /// @brief Number of elements.
    /// @return batch * heads * seq * head_dim.
    ROPE_HOST_DEVICE int64_t numel() const { return batch * heads * seq * head_dim; }
};

/// @brief A non-owning view of a q or k tensor: 4-D, or 3-D for packed sequences.
///
/// `shape` and `strides` are given in the order the layout names: for
/// Layout::bshd, shape = {batch, seq, heads, head_dim}; for Layout::thd,
/// shape = {total_tokens, heads, head_dim, 1} (the fourth entry is a unit axis
/// and its stride is never used). Strides are in elements and may describe
/// padded or sliced (non-contiguous) memory.
struct TensorView {
    void* data = nullptr;                 ///< First element; may be null only when the view is empty.
    DType dtype = DType::f32;             ///< Storage type of the elements.
    Device device = Device::host;         ///< Where `data` points.
    Layout layout = Layout::bhsd;         ///< Meaning of the four axes.
    std::array<int64_t, 4> shape{};       ///< Sizes, in layout order.
    std::array<int64_t, 4> strides{};     ///< Element strides, in layout order.

    /// @brief A densely packed (row-major) view of @p shape in @p layout.
    /// @param data first element (may be null for an empty view).
    /// @param dtype storage type of the elements.
    /// @param device where @p data points.
    /// @param layout meaning of the four axes of @p shape.
    /// @param shape sizes in layout order.
    /// @return the view, with row-major strides (the last axis contiguous; a size-0 axis counts as 1).
    static TensorView contiguous(void* data, DType dtype, Device device, Layout layout,
                                 std::array<int64_t, 4> shape);

    /// @brief A densely packed view of packed sequences, [total_tokens, heads, head_dim] (Layout::thd).
    /// @param data first element (may be null for an empty view).
    /// @param dtype storage type of the elements.
    /// @param device where @p data points.
    /// @param shape {total_tokens, heads, head_dim}.
    /// @return the view, with row-major strides and shape[3] = 1.
    static TensorView packed(void* data, DType dtype, Device device, std::array<int64_t, 3> shape);

    /// @brief Sizes and strides re-ordered to (batch, heads, seq, dim).
    /// @return the layout-independent Geometry of this view.
    Geometry geometry() const;

    /// @brief Number of elements.
    /// @return the product of the four sizes (0 for an empty view, whatever its
    /// other sizes; a thd view's shape[3] is 1).
    int64_t numel() const {
        // An empty view's other sizes may be anything, even 2^63 - 1: never multiply them.
        if (shape[0] == 0 || shape[1] == 0 || shape[2] == 0 || shape[3] == 0) return 0;
        return shape[0] * shape[1] * shape[2] * shape[3];
    }
};

}  // namespace rope

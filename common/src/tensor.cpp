// TensorView helpers: dense strides and the layout-independent Geometry.
#include <string>

#include "rope/error.hpp"
#include "rope/tensor.hpp"

namespace rope {

TensorView TensorView::contiguous(void* data, DType dtype, Device device, Layout layout,
                                  std::array<int64_t, 4> shape) {
    TensorView view{data, dtype, device, layout, shape, {}};
    // Row-major: the last axis is contiguous, each earlier axis steps over all later ones.
    int64_t stride = 1;
    for (int axis = 3; axis >= 0; --axis) {
        view.strides[axis] = stride;
        stride *= shape[axis] > 0 ? shape[axis] : 1;
    }
    return view;
}

TensorView TensorView::packed(void* data, DType dtype, Device device, std::array<int64_t, 3> shape) {
    return contiguous(data, dtype, device, Layout::thd, {shape[0], shape[1], shape[2], 1});
}

Layout parse_layout(std::string_view name) {
    for (Layout layout : {Layout::bhsd, Layout::bshd, Layout::thd})
        if (name == layout_name(layout)) return layout;
    fail("layout", std::string(name), "expected bhsd, bshd or thd");
}

Geometry TensorView::geometry() const {
    if (layout == Layout::thd) {
        // Packed tokens are one long sequence: batch 1, seq = total_tokens.
        Geometry g;
        g.batch = 1;
        g.seq = shape[0];
        g.heads = shape[1];
        g.head_dim = shape[2];
        g.stride_batch = 0;
        g.stride_seq = strides[0];
        g.stride_head = strides[1];
        g.stride_dim = strides[2];
        return g;
    }
    // Axis positions of (heads, seq) depend on the layout; batch and dim never move.
    const int head_axis = layout == Layout::bhsd ? 1 : 2;
    const int seq_axis = layout == Layout::bhsd ? 2 : 1;
    Geometry g;
    g.batch = shape[0];
    g.heads = shape[head_axis];
    g.seq = shape[seq_axis];
    g.head_dim = shape[3];
    g.stride_batch = strides[0];
    g.stride_head = strides[head_axis];
    g.stride_seq = strides[seq_axis];
    g.stride_dim = strides[3];
    return g;
}

}  // namespace rope

// make_plan: every check a RoPE call must pass, in one place for all backends.
//
// Each failure names the parameter as the user wrote it (q.shape[2], k.device,
// positions.length, ...) and the value it had, so bad input is diagnosed
// without reading this file.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "rope/error.hpp"
#include "rope/plan.hpp"

namespace rope {
namespace {

// Text for a shape, e.g. "[4, 8, 256, 64]".
std::string shape_text(const std::array<int64_t, 4>& shape) {
    std::string text = "[";
    for (int axis = 0; axis < 4; ++axis) text += (axis ? ", " : "") + std::to_string(shape[axis]);
    return text + "]";
}

// Checks one view on its own: sizes, strides, pointer, device, dtype.
void check_view(const std::string& name, const TensorView& view, DType dtype, Device device) {
    for (int axis = 0; axis < 4; ++axis) {
        const std::string axis_name = name + ".shape[" + std::to_string(axis) + "]";
        if (view.shape[axis] < 0) fail(axis_name, view.shape[axis], "sizes must be >= 0");
        const std::string stride_name = name + ".strides[" + std::to_string(axis) + "]";
        if (view.strides[axis] < 0) fail(stride_name, view.strides[axis], "strides must be >= 0");
    }
    if (view.numel() == 0) return;  // An empty view may have any pointer, device or dtype.
    if (view.data == nullptr) fail(name + ".data", "null", "a non-empty tensor needs memory");
    if (view.device != device)
        fail(name + ".device", device_name(view.device),
             "this backend runs on " + std::string(device_name(device)));
    if (view.dtype != dtype)
        fail(name + ".dtype", dtype_name(view.dtype),
             "all tensors must share q's dtype " + std::string(dtype_name(dtype)));
}

// Outputs must address every element once: a stride pattern that maps two
// elements to one address would make the result depend on write order.
void check_no_self_overlap(const std::string& name, const TensorView& view) {
    if (view.numel() == 0) return;
    std::array<int, 4> order{0, 1, 2, 3};
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return view.strides[a] < view.strides[b]; });
    int64_t reach = 1;  // Elements spanned by the smaller-strided axes so far.
    for (int axis : order) {
        if (view.shape[axis] == 1) continue;
        if (view.strides[axis] < reach)
            fail(name + ".strides[" + std::to_string(axis) + "]", view.strides[axis],
                 "overlaps other elements of " + name + " (strides " + shape_text(view.strides) +
                     " for shape " + shape_text(view.shape) + ")");
        reach = view.strides[axis] * view.shape[axis];
    }
}

// Byte range [begin, end) that a view touches.
struct Extent {
    uintptr_t begin = 0;
    uintptr_t end = 0;
};

Extent extent_of(const TensorView& view) {
    if (view.numel() == 0) return {};
    int64_t last = 0;
    for (int axis = 0; axis < 4; ++axis) last += (view.shape[axis] - 1) * view.strides[axis];
    const auto begin = reinterpret_cast<uintptr_t>(view.data);
    return {begin, begin + static_cast<uintptr_t>((last + 1) * dtype_size(view.dtype))};
}

bool overlaps(const TensorView& a, const TensorView& b) {
    const Extent x = extent_of(a), y = extent_of(b);
    return x.begin < x.end && y.begin < y.end && x.begin < y.end && y.begin < x.end;
}

// In place means the output is exactly the input: same memory, same element for each index.
bool same_elements(const TensorView& a, const TensorView& b) {
    if (a.data != b.data) return false;
    const Geometry x = a.geometry(), y = b.geometry();
    return x.stride_batch == y.stride_batch && x.stride_head == y.stride_head &&
           x.stride_seq == y.stride_seq && x.stride_dim == y.stride_dim;
}

// An output may coincide exactly with its own input (in place) but must not
// otherwise share a byte with any other operand: a partially aliased output
// would overwrite inputs before they are read.
void check_aliasing(const RopeArgs& args) {
    struct Named {
        const char* name;
        const TensorView* view;
    };
    const std::array<Named, 4> all{{{"q", &args.q}, {"k", &args.k}, {"q_out", &args.q_out}, {"k_out", &args.k_out}}};
    const std::array<Named, 2> outputs{{{"q_out", &args.q_out}, {"k_out", &args.k_out}}};
    const std::array<const TensorView*, 2> own_input{&args.q, &args.k};
    for (size_t o = 0; o < outputs.size(); ++o) {
        for (const Named& other : all) {
            if (other.view == outputs[o].view) continue;
            if (other.view == own_input[o] && same_elements(*other.view, *outputs[o].view)) continue;
            if (overlaps(*outputs[o].view, *other.view))
                fail(std::string(outputs[o].name) + ".data", outputs[o].view->data,
                     std::string("partially aliases ") + other.name +
                         " (outputs must be their own input exactly, or not overlap at all)");
        }
    }
}

void check_same_sizes(const std::string& name, const Geometry& got, const std::string& reference_name,
                      const Geometry& reference, bool compare_heads) {
    const std::array<std::pair<const char*, std::pair<int64_t, int64_t>>, 4> sizes{{
        {"batch", {got.batch, reference.batch}},
        {"seq", {got.seq, reference.seq}},
        {"head_dim", {got.head_dim, reference.head_dim}},
        {"heads", {got.heads, reference.heads}},
    }};
    for (const auto& [what, values] : sizes) {
        if (!compare_heads && std::string(what) == "heads") continue;
        if (values.first != values.second)
            fail(name + " " + what, values.first,
                 "must equal " + reference_name + " " + what + " = " + std::to_string(values.second));
    }
}

// Scaling types whose frequencies depend on how long the sequence is.
bool length_dependent(ScalingType type) { return type == ScalingType::dynamic || type == ScalingType::longrope; }

PositionSource check_positions(const Positions& positions, int64_t batch, int64_t seq, Device device,
                               ScalingType scaling, int64_t& max_position) {
    PositionSource source;
    if (positions.ids == nullptr) {
        if (positions.offset < 0) fail("positions.offset", positions.offset, "must be >= 0");
        source.offset = positions.offset;
        max_position = positions.offset + seq;
        return source;
    }
    if (positions.rows != 1 && positions.rows != batch)
        fail("positions.rows", positions.rows, "must be 1 or batch = " + std::to_string(batch));
    if (positions.length != seq)
        fail("positions.length", positions.length, "must equal seq = " + std::to_string(seq));
    if (positions.device != device)
        fail("positions.device", device_name(positions.device),
             "this backend runs on " + std::string(device_name(device)));
    max_position = seq;
    if (positions.device != Device::host) {
        if (positions.max_position < 0)
            fail("positions.max_position", positions.max_position, "must be >= 0 (0 means unknown)");
        if (length_dependent(scaling) && positions.max_position == 0)
            fail("positions.max_position", positions.max_position,
                 std::string("must be given (largest id + 1) for device-resident ids with scaling type ") +
                     std::string(scaling_type_name(scaling)) + ", whose frequencies depend on the length");
        max_position = std::max(seq, positions.max_position);
    }
    if (positions.device == Device::host) {
        // Device-resident ids cannot be inspected without a copy; host ids are checked.
        for (int64_t i = 0; i < positions.rows * positions.length; ++i) {
            if (positions.ids[i] < 0) fail("positions.ids[" + std::to_string(i) + "]", positions.ids[i], "must be >= 0");
            max_position = std::max(max_position, positions.ids[i] + 1);
        }
    }
    source.ids = positions.ids;
    source.row_stride = positions.rows == 1 ? 0 : seq;
    return source;
}

}  // namespace

Plan make_plan(const RopeConfig& config, const RopeArgs& args, Device device) {
    validate(config);
    const DType dtype = args.q.dtype;
    check_view("q", args.q, dtype, device);
    check_view("k", args.k, dtype, device);
    check_view("q_out", args.q_out, dtype, device);
    check_view("k_out", args.k_out, dtype, device);

    const Geometry q = args.q.geometry(), k = args.k.geometry();
    if (q.head_dim != config.head_dim)
        fail("q head_dim", q.head_dim, "must equal config.head_dim = " + std::to_string(config.head_dim));
    check_same_sizes("k", k, "q", q, /*compare_heads=*/false);
    check_same_sizes("q_out", args.q_out.geometry(), "q", q, true);
    check_same_sizes("k_out", args.k_out.geometry(), "k", k, true);
    if (k.heads > 0 && q.heads % k.heads != 0)
        fail("k heads", k.heads, "must divide q heads = " + std::to_string(q.heads) + " (grouped-query attention)");

    check_no_self_overlap("q_out", args.q_out);
    check_no_self_overlap("k_out", args.k_out);
    check_aliasing(args);

    Plan plan;
    int64_t max_position = 0;
    plan.positions = check_positions(args.positions, q.batch, q.seq, device, config.scaling.type, max_position);
    plan.style = config.style;
    plan.direction = args.direction;
    plan.dtype = dtype;
    plan.device = device;
    plan.batch = q.batch;
    plan.seq = q.seq;
    plan.head_dim = q.head_dim;
    plan.rotary_dim = config.effective_rotary_dim();
    plan.pairs = plan.rotary_dim / 2;
    plan.q = Operand{args.q.data, args.q_out.data, q, args.q_out.geometry()};
    plan.k = Operand{args.k.data, args.k_out.data, k, args.k_out.geometry()};
    plan.frequencies = make_frequency_table(config, max_position);
    plan.precise_angles = config.precise_angles;
    plan.stream = args.stream;
    return plan;
}

}  // namespace rope

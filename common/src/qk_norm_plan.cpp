// make_qk_norm_plan: every check a fused QK-norm + RoPE call must pass, for all backends,
// and rope::apply_qk_norm. The RoPE part (views, sizes, aliasing, positions, table) is
// make_plan's, on q and k as views (a qkv buffer's slices become views first); the norm
// adds its weights, eps, the qkv buffer's head counts and v_out.
#include <array>
#include <cmath>
#include <cstdint>
#include <string>

#include "rope/backend.hpp"
#include "rope/detail/qk_norm_plan.hpp"
#include "rope/error.hpp"

namespace rope {

std::string_view qk_norm_kind_name(QkNormKind kind) {
    switch (kind) {
        case QkNormKind::per_head: return "per_head";
        case QkNormKind::per_head_gemma: return "per_head_gemma";
        case QkNormKind::across_heads: return "across_heads";
    }
    return "unknown";
}

QkNormKind parse_qk_norm_kind(std::string_view name) {
    for (QkNormKind kind : {QkNormKind::per_head, QkNormKind::per_head_gemma, QkNormKind::across_heads})
        if (name == qk_norm_kind_name(kind)) return kind;
    fail("kind", std::string(name), "expected per_head, per_head_gemma or across_heads");
}

std::string_view qk_norm_rounding_name(QkNormRounding rounding) {
    switch (rounding) {
        case QkNormRounding::float32: return "float32";
        case QkNormRounding::hf_qwen3: return "hf_qwen3";
        case QkNormRounding::hf_gemma3: return "hf_gemma3";
        case QkNormRounding::hf_olmo2: return "hf_olmo2";
    }
    return "unknown";
}

QkNormRounding parse_qk_norm_rounding(std::string_view name) {
    for (QkNormRounding rounding : {QkNormRounding::float32, QkNormRounding::hf_qwen3, QkNormRounding::hf_gemma3,
                                    QkNormRounding::hf_olmo2})
        if (name == qk_norm_rounding_name(rounding)) return rounding;
    fail("rounding", std::string(name), "expected float32, hf_qwen3, hf_gemma3 or hf_olmo2");
}

namespace {

// Byte range [begin, end) of a view or a weight (empty for no elements).
struct Span {
    uintptr_t begin = 0, end = 0;
    bool overlaps(const Span& other) const {
        return begin < end && other.begin < other.end && begin < other.end && other.begin < end;
    }
};

Span span_of(const TensorView& view) {
    if (view.numel() == 0) return {};
    int64_t last = 0;
    for (int axis = 0; axis < 4; ++axis) last += (view.shape[axis] - 1) * view.strides[axis];
    const auto begin = reinterpret_cast<uintptr_t>(view.data);
    return {begin, begin + uintptr_t((last + 1) * dtype_size(view.dtype))};
}

Span span_of(const NormWeight& weight) {
    if (weight.data == nullptr || weight.size <= 0) return {};
    const auto begin = reinterpret_cast<uintptr_t>(weight.data);
    return {begin, begin + uintptr_t(weight.size * dtype_size(weight.dtype))};
}

// A [tokens, heads, head_dim] slice of a qkv buffer, starting @p first_feature into each row.
TensorView slice_of(const QkvBuffer& qkv, int64_t first_feature, int64_t heads, int64_t head_dim) {
    const int64_t row_stride = qkv.row_stride == 0 ? qkv.width : qkv.row_stride;
    TensorView view;
    view.data = qkv.data == nullptr ? nullptr : static_cast<char*>(qkv.data) + first_feature * dtype_size(qkv.dtype);
    view.dtype = qkv.dtype;
    view.device = qkv.device;
    view.layout = Layout::thd;
    view.shape = {qkv.tokens, heads, head_dim, 1};
    view.strides = {row_stride, head_dim, 1, 0};
    return view;
}

std::string shape_text(const std::array<int64_t, 4>& shape) {
    std::string text("[");
    for (int axis = 0; axis < 4; ++axis) text.append(axis ? ", " : "").append(std::to_string(shape[axis]));
    return text.append("]");
}

void check_qkv(const QkvBuffer& qkv, int64_t head_dim, Device device) {
    const auto sizes = {std::pair<const char*, int64_t>{"qkv.tokens", qkv.tokens}, {"qkv.q_heads", qkv.q_heads},
                        {"qkv.kv_heads", qkv.kv_heads}, {"qkv.width", qkv.width}, {"qkv.row_stride", qkv.row_stride}};
    for (const auto& [name, value] : sizes)
        if (value < 0) fail(name, value, "must be >= 0");
    int64_t heads = 0, width = 0;
    if (__builtin_mul_overflow(qkv.kv_heads, 2, &heads) || __builtin_add_overflow(heads, qkv.q_heads, &heads) ||
        __builtin_mul_overflow(heads, head_dim, &width) || width != qkv.width)
        fail("qkv.width", qkv.width,
             "must equal (q_heads + 2 * kv_heads) * head_dim = (" + std::to_string(qkv.q_heads) + " + 2 * " +
                 std::to_string(qkv.kv_heads) + ") * " + std::to_string(head_dim) +
                 " (the head counts do not add up to the buffer's row)");
    if (qkv.device != device)
        fail("qkv.device", device_name(qkv.device), "this backend runs on " + std::string(device_name(device)));
    if (qkv.row_stride != 0 && qkv.row_stride < qkv.width)
        fail("qkv.row_stride", qkv.row_stride, "must be >= width = " + std::to_string(qkv.width) + " (or 0)");
}

void check_weight(std::string_view name, const NormWeight& weight, int64_t expected, std::string_view what,
                  DType dtype, Device device) {
    const std::string n(name);
    if (weight.size != expected)
        fail(n + ".size", weight.size, "must equal " + std::string(what) + " = " + std::to_string(expected));
    if (weight.data == nullptr) fail(n + ".data", "null", "the norm needs its weight");
    if (weight.dtype != DType::f32 && weight.dtype != dtype)
        fail(n + ".dtype", dtype_name(weight.dtype),
             "must be fp32 or the tensors' dtype " + std::string(dtype_name(dtype)));
    if (reinterpret_cast<uintptr_t>(weight.data) % uintptr_t(dtype_size(weight.dtype)) != 0)
        fail(n + ".data", weight.data, "must be aligned to its element size");
    if (weight.device != device)
        fail(n + ".device", device_name(weight.device), "this backend runs on " + std::string(device_name(device)));
}

// v_out: a copy of the qkv buffer's v slice, the same sizes, dtype and device, touching no other operand.
void check_v_out(const TensorView& v_out, const TensorView& v, Device device) {
    if (v_out.data == nullptr) return;
    const Geometry got = v_out.geometry(), want = v.geometry();
    if (got.batch != want.batch || got.heads != want.heads || got.seq != want.seq || got.head_dim != want.head_dim)
        fail("v_out.shape", shape_text(v_out.shape),
             "must hold the qkv buffer's v: " + std::to_string(want.seq) + " tokens, " + std::to_string(want.heads) +
                 " heads of " + std::to_string(want.head_dim));
    for (int axis = 0; axis < 4; ++axis)
        if (v_out.strides[axis] < 0) fail("v_out.strides[" + std::to_string(axis) + "]", v_out.strides[axis], "must be >= 0");
    if (v_out.dtype != v.dtype)
        fail("v_out.dtype", dtype_name(v_out.dtype), "must be the qkv buffer's " + std::string(dtype_name(v.dtype)));
    if (v_out.device != device)
        fail("v_out.device", device_name(v_out.device), "this backend runs on " + std::string(device_name(device)));
    if (reinterpret_cast<uintptr_t>(v_out.data) % uintptr_t(dtype_size(v_out.dtype)) != 0)
        fail("v_out.data", v_out.data, "must be aligned to its element size");
}

}  // namespace

QkNormPlan make_qk_norm_plan(const RopeConfig& config, const QkNormArgs& args, Device device) {
    validate(config);
    detail::refuse_window_and_reordering(config, "apply_qk_norm");
    const int kind = static_cast<int>(args.kind), rounding = static_cast<int>(args.rounding);
    if (kind < 0 || kind > static_cast<int>(QkNormKind::across_heads))
        fail("kind", kind, "expected per_head, per_head_gemma or across_heads");
    if (rounding < 0 || rounding > static_cast<int>(QkNormRounding::hf_olmo2))
        fail("rounding", rounding, "expected float32, hf_qwen3, hf_gemma3 or hf_olmo2");
    const float eps = static_cast<float>(args.eps);
    if (!std::isfinite(args.eps) || !(args.eps > 0) || !std::isfinite(eps) || !(eps > 0))
        fail("eps", args.eps, "must be > 0 and finite in float32 (it is added to mean(x^2) in float32)");

    // q and k as views: the caller's, or the qkv buffer's slices.
    TensorView q = args.q, k = args.k, q_out = args.q_out, k_out = args.k_out, v;
    const bool packed = args.qkv.data != nullptr;
    if (packed) {
        if (args.q.data != nullptr || args.k.data != nullptr)
            fail(args.q.data != nullptr ? "q.data" : "k.data", args.q.data != nullptr ? args.q.data : args.k.data,
                 "must be null with a qkv buffer (q and k are its slices)");
        check_qkv(args.qkv, config.head_dim, device);
        q = slice_of(args.qkv, 0, args.qkv.q_heads, config.head_dim);
        k = slice_of(args.qkv, args.qkv.q_heads * config.head_dim, args.qkv.kv_heads, config.head_dim);
        v = slice_of(args.qkv, (args.qkv.q_heads + args.qkv.kv_heads) * config.head_dim, args.qkv.kv_heads,
                     config.head_dim);
        if (q_out.data == nullptr) q_out = q;
        if (k_out.data == nullptr) k_out = k;
        check_v_out(args.v_out, v, device);
    } else if (args.v_out.data != nullptr) {
        fail("v_out.data", args.v_out.data, "is only written with a qkv buffer (v is copied out of it)");
    }

    QkNormPlan plan;
    if (!packed) {
        plan.rope = make_plan(config, RopeArgs{q, k, q_out, k_out, args.positions, Direction::forward, args.stream,
                                               args.cos_sin_cache},
                              device);
    } else {
        // The slices interleave row by row, so make_plan's byte-range test would call them aliased:
        // each is validated on its own (they are disjoint by construction), and any separate
        // outputs are checked here against the buffer and each other.
        const Span buffer = span_of(slice_of(args.qkv, 0, 1, args.qkv.width));
        const Span q_span = q_out.data != q.data ? span_of(q_out) : Span{};
        const Span k_span = k_out.data != k.data ? span_of(k_out) : Span{};
        if (q_span.overlaps(buffer) || q_span.overlaps(k_span))
            fail("q_out.data", q_out.data, "must not overlap the qkv buffer or k_out (or be null: in place)");
        if (k_span.overlaps(buffer)) fail("k_out.data", k_out.data, "must not overlap the qkv buffer (or be null: in place)");
        const Geometry kg = k.geometry(), ko = k_out.geometry();
        if (kg.batch != ko.batch || kg.heads != ko.heads || kg.seq != ko.seq || kg.head_dim != ko.head_dim)
            fail("k_out.shape", shape_text(k_out.shape), "must hold the qkv buffer's k: " + std::to_string(kg.seq) +
                                                             " tokens, " + std::to_string(kg.heads) + " heads");
        TensorView none = slice_of(args.qkv, 0, 0, config.head_dim);  // no heads: q alone, then k alone
        const auto one = [&](const TensorView& in, const TensorView& out) {
            return make_plan(config, RopeArgs{in, none, out, none, args.positions, Direction::forward, args.stream,
                                              args.cos_sin_cache},
                             device);
        };
        const Plan q_plan = one(q, q_out), k_plan = one(k, k_out);
        plan.rope = q_plan.empty() ? k_plan : q_plan;  // the one with angles, if either has heads
        plan.rope.q = q_plan.q;
        plan.rope.k = k_plan.q;
    }

    const Geometry qg = q.geometry(), kg = k.geometry();
    const bool across = args.kind == QkNormKind::across_heads;
    if (qg.heads > 0)
        check_weight("q_weight", args.q_weight, across ? qg.heads * config.head_dim : config.head_dim,
                     across ? "q heads * head_dim" : "head_dim", q.dtype, device);
    if (kg.heads > 0)
        check_weight("k_weight", args.k_weight, across ? kg.heads * config.head_dim : config.head_dim,
                     across ? "k heads * head_dim" : "head_dim", q.dtype, device);
    // Weights and the qkv buffer are read while the outputs are written.
    const Span outputs[] = {span_of(q_out), span_of(k_out), span_of(args.v_out)};
    const char* output_names[] = {"q_out", "k_out", "v_out"};
    const std::pair<const char*, Span> inputs[] = {
        {"q_weight", qg.heads > 0 ? span_of(args.q_weight) : Span{}},
        {"k_weight", kg.heads > 0 ? span_of(args.k_weight) : Span{}},
        {"qkv", packed && args.v_out.data != nullptr ? span_of(slice_of(args.qkv, 0, 1, args.qkv.width)) : Span{}}};
    for (int o = 0; o < 3; ++o)
        for (const auto& [name, span] : inputs)
            if (outputs[o].overlaps(span) && !(o < 2 && std::string_view(name) == "qkv"))
                fail(std::string(output_names[o]) + ".data", "overlapping " + std::string(name),
                     "outputs may not share memory with the norm's weights (or v_out with the qkv buffer)");

    plan.step.style = config.style;
    plan.step.head_dim = config.head_dim;
    plan.step.rotary_dim = plan.rope.rotary_dim;
    plan.step.pairs = plan.rope.pairs;
    plan.step.axes = plan.rope.axes;
    plan.step.kind = args.kind;
    plan.step.rounding = args.rounding;
    plan.step.eps = eps;
    plan.step.operands[0] = NormOperand{plan.rope.q, args.q_weight.data, args.q_weight.dtype};
    plan.step.operands[1] = NormOperand{plan.rope.k, args.k_weight.data, args.k_weight.dtype};
    if (packed && args.v_out.data != nullptr) plan.v = Operand{v.data, args.v_out.data, v.geometry(), args.v_out.geometry()};
    return plan;
}

void Backend::run_qk_norm(const QkNormPlan&) {
    fail("backend", name(), "does not implement the fused QK-norm + RoPE call (run_qk_norm)");
}

void apply_qk_norm(Backend& backend, const RopeConfig& config, const QkNormArgs& args) {
    const QkNormPlan plan = make_qk_norm_plan(config, args, backend.device());
    const BackendLimits limits = backend.limits();
    if (plan.rope.rotary_dim > limits.max_rotary_dim)
        fail("rotary_dim", plan.rope.rotary_dim,
             backend.name() + " accepts rotary_dim <= " + std::to_string(limits.max_rotary_dim));
    if (plan.empty()) return;
    backend.run_qk_norm(plan);
}

}  // namespace rope

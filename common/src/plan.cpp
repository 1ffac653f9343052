// make_plan: every check a RoPE call must pass, in one place for all backends;
// and make_cos_sin_cache, which builds a caller's table by the same angle rule and checks.
//
// Each failure names the parameter as the user wrote it (q.shape[2], k.device,
// positions.length, ...) and the value it had, so bad input is diagnosed
// without reading this file.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "rope/error.hpp"
#include "rope/detail/pair_step.hpp"
#include "rope/detail/plan.hpp"

namespace rope {
namespace {

// Text for a shape, e.g. "[4, 8, 256, 64]".
std::string shape_text(const std::array<int64_t, 4>& shape) {
    std::string text = "[";
    for (int axis = 0; axis < 4; ++axis) text += (axis ? ", " : "") + std::to_string(shape[axis]);
    return text + "]";
}

// Whether a view's element count and the byte offset of its last element fit
// in int64, as every backend (and numel()) computes them. Sizes and strides
// that overflow describe no memory that could exist.
bool addressable(const TensorView& view) {
    for (int axis = 0; axis < 4; ++axis)
        if (view.shape[axis] == 0) return true;  // no element to address
    int64_t count = 1, last = 0, reach = 0, bytes = 0;
    for (int axis = 0; axis < 4; ++axis)
        if (__builtin_mul_overflow(count, view.shape[axis], &count) ||
            __builtin_mul_overflow(view.shape[axis] - 1, view.strides[axis], &reach) ||
            __builtin_add_overflow(last, reach, &last))
            return false;
    return !__builtin_add_overflow(last, 1, &last) && !__builtin_mul_overflow(last, dtype_size(view.dtype), &bytes);
}

// Checks one view on its own: sizes, strides, pointer, device, dtype.
void check_view(std::string_view name, const TensorView& view, DType dtype, Device device) {
    // Names are built only for a failure: this runs on every call, where allocating them would cost more than the checks.
    for (int axis = 0; axis < 4; ++axis) {
        if (view.shape[axis] < 0)
            fail(std::string(name) + ".shape[" + std::to_string(axis) + "]", view.shape[axis], "sizes must be >= 0");
        if (view.strides[axis] < 0)
            fail(std::string(name) + ".strides[" + std::to_string(axis) + "]", view.strides[axis],
                 "strides must be >= 0");
    }
    if (view.layout == Layout::thd && view.shape[3] != 1)
        fail(std::string(name) + ".shape[3]", view.shape[3],
             "must be 1 for a thd view ([total_tokens, heads, head_dim])");
    if (!addressable(view))
        fail(std::string(name) + ".shape", shape_text(view.shape),
             "with strides " + shape_text(view.strides) + ": its element count or offsets overflow 64 bits");
    if (view.numel() == 0) return;  // An empty view may have any pointer, device or dtype.
    if (view.data == nullptr) fail(std::string(name) + ".data", "null", "a non-empty tensor needs memory");
    // Backends read elements as their type: a pointer between elements is undefined behaviour.
    if (reinterpret_cast<uintptr_t>(view.data) % uintptr_t(dtype_size(view.dtype)) != 0)
        fail(std::string(name) + ".data", view.data,
             "must be aligned to " + std::to_string(dtype_size(view.dtype)) + " bytes (the size of a " +
                 std::string(dtype_name(view.dtype)) + " element)");
    if (view.device != device)
        fail(std::string(name) + ".device", device_name(view.device),
             "this backend runs on " + std::string(device_name(device)));
    if (view.dtype != dtype)
        fail(std::string(name) + ".dtype", dtype_name(view.dtype),
             "all tensors must share q's dtype " + std::string(dtype_name(dtype)));
}

// Outputs must address every element once: a stride pattern that maps two
// elements to one address would make the result depend on write order.
void check_no_self_overlap(std::string_view name, const TensorView& view) {
    if (view.numel() == 0) return;
    std::array<int, 4> order{0, 1, 2, 3};
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return view.strides[a] < view.strides[b]; });
    int64_t reach = 1;  // Elements spanned by the smaller-strided axes so far.
    for (int axis : order) {
        if (view.shape[axis] == 1) continue;
        if (view.strides[axis] < reach)
            fail(std::string(name) + ".strides[" + std::to_string(axis) + "]", view.strides[axis],
                 "overlaps other elements of " + std::string(name) + " (strides " + shape_text(view.strides) +
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

// Byte range of a caller's cos/sin table (empty when there is none or it is malformed;
// check_table names those, except a size that overflows 64 bits, named here). The
// elements are counted at the table's own dtype: a wrong one (fp16, bf16) is named by
// check_table, and counted as 4 bytes here it could seem to reach into the next
// allocation and be reported as an overlap instead, depending on where memory lies.
Extent extent_of(const CosSinCache& cache) {
    if (cache.data == nullptr || cache.rows <= 0 || cache.cols <= 0) return {};
    const int64_t row_stride = std::max(cache.row_stride, cache.cols);
    int64_t elements = 0, bytes = 0;
    if (__builtin_mul_overflow(cache.rows - 1, row_stride, &elements) ||
        __builtin_add_overflow(elements, cache.cols, &elements) ||
        __builtin_mul_overflow(elements, dtype_size(cache.dtype), &bytes))
        fail("cos_sin_cache.rows", cache.rows,
             "with row_stride " + std::to_string(row_stride) + ": the table's size overflows 64 bits");
    const auto begin = reinterpret_cast<uintptr_t>(cache.data);
    return {begin, begin + static_cast<uintptr_t>(bytes)};
}

bool overlaps(const Extent& x, const Extent& y) {
    return x.begin < x.end && y.begin < y.end && x.begin < y.end && y.begin < x.end;
}

bool overlaps(const TensorView& a, const TensorView& b) { return overlaps(extent_of(a), extent_of(b)); }

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
        if (overlaps(extent_of(*outputs[o].view), extent_of(args.cos_sin_cache)))
            fail(std::string(outputs[o].name) + ".data", outputs[o].view->data,
                 "overlaps cos_sin_cache (the table is read while outputs are written)");
    }
}

void check_same_sizes(std::string_view name, const Geometry& got, std::string_view reference_name,
                      const Geometry& reference, bool compare_heads) {
    const std::array<std::pair<const char*, std::pair<int64_t, int64_t>>, 4> sizes{{
        {"batch", {got.batch, reference.batch}},
        {"seq", {got.seq, reference.seq}},
        {"head_dim", {got.head_dim, reference.head_dim}},
        {"heads", {got.heads, reference.heads}},
    }};
    for (const auto& [what, values] : sizes) {
        if (!compare_heads && std::string_view(what) == "heads") continue;
        if (values.first != values.second)
            fail(std::string(name) + " " + what, values.first,
                 "must equal " + std::string(reference_name) + " " + what + " = " + std::to_string(values.second));
    }
}

// Scaling types whose frequencies depend on how long the sequence is.
bool length_dependent(ScalingType type) { return type == ScalingType::dynamic || type == ScalingType::longrope; }

void check_device(std::string_view name, Device got, Device device) {
    if (got != device)
        fail(name, device_name(got), "this backend runs on " + std::string(device_name(device)));
}

// What check_positions learns about the call's positions.
using PositionFacts = detail::PositionFacts;

// End of @p count consecutive positions from @p first on each of @p shards
// context-parallel ranks: first + count * shards, the call's max_position.
// It must fit in int64, as must every position the backends compute below it.
int64_t positions_end(std::string_view name, int64_t first, int64_t count, int64_t shards) {
    int64_t span = 0, end = 0;
    if (__builtin_mul_overflow(count, shards, &span) || __builtin_add_overflow(first, span, &end))
        fail(name, first,
             "its " + std::to_string(count) + " x " + std::to_string(shards) + " positions would pass 2^63 - 1");
    return end;
}

// Explicit ids: [axes, rows, length], int64.
void check_ids(std::string_view name, const Positions& positions, int64_t batch, int64_t seq, int64_t config_axes, PositionFacts& facts) {
    if (positions.axes != config_axes)
        fail(std::string(name) + ".axes", positions.axes,
             "must equal the config's position axes = " + std::to_string(config_axes) +
                 (config_axes == 1 ? " (multi_axis.assignment single)" : " (multi_axis.sections.size())"));
    if (positions.rows != 1 && positions.rows != batch)
        fail(std::string(name) + ".rows", positions.rows, "must be 1 or batch = " + std::to_string(batch));
    if (positions.length != seq) fail(std::string(name) + ".length", positions.length, "must equal seq = " + std::to_string(seq));
    if (positions.cp_size != 1)
        fail(std::string(name) + ".cp_size", positions.cp_size,
             "must be 1 with explicit ids (ids are global positions already: pass this shard's ids)");
    facts.source.ids = positions.ids;
    facts.source.axis_stride = positions.rows * positions.length;
    facts.source.row_stride = positions.rows == 1 ? 0 : seq;
    if (positions.device != Device::host) return;
    // Device-resident ids cannot be inspected without a copy; host ids are checked.
    for (int64_t i = 0; i < positions.axes * positions.rows * positions.length; ++i) {
        if (positions.ids[i] < 0) fail(std::string(name) + ".ids[" + std::to_string(i) + "]", positions.ids[i], "must be >= 0");
        facts.largest = std::max(facts.largest, positions.ids[i]);
    }
    // As HF's dynamic and longrope updates: max(position_ids) + 1, whatever seq is
    // (M-RoPE ids of an image advance more slowly than its tokens).
    facts.max_position = facts.largest < 0 ? 0 : positions_end(std::string(name) + ".ids", facts.largest, 1, 1);
}

// Packed sequences: cu_seqlens [sequences + 1] over the seq axis of a batch-1 tensor.
void check_packed(std::string_view name, const Positions& positions, int64_t batch, int64_t seq, PositionFacts& facts) {
    if (batch != 1)
        fail("batch", batch, "must be 1 with cu_seqlens (a thd tensor, or a bshd/bhsd view of one packed row)");
    if (positions.sequences < 1) fail(std::string(name) + ".sequences", positions.sequences, "must be >= 1 with cu_seqlens");
    facts.source.cu_seqlens = positions.cu_seqlens;
    facts.source.starts = positions.starts;
    facts.source.sequences = positions.sequences;
    if (positions.device != Device::host) return;
    const int64_t* cu = positions.cu_seqlens;
    if (cu[0] != 0) fail(std::string(name) + ".cu_seqlens[0]", cu[0], "must be 0");
    for (int64_t b = 0; b < positions.sequences; ++b) {
        const auto entry = [b, name] { return std::string(name) + ".cu_seqlens[" + std::to_string(b + 1) + "]"; };
        // Compared before subtracting: with the entries so far in [0, seq], the difference cannot overflow.
        if (cu[b + 1] < cu[b])
            fail(entry(), cu[b + 1], "must be >= cu_seqlens[" + std::to_string(b) + "] = " + std::to_string(cu[b]) +
                                       " (non-decreasing)");
        const int64_t length = cu[b + 1] - cu[b];
        if (cu[b + 1] > seq) fail(entry(), cu[b + 1], "must be <= total tokens = " + std::to_string(seq));
        if (positions.cp_size > 1 && length % 2 != 0)
            fail("sequence " + std::to_string(b) + " length", length,
                 "must be even with cp_size > 1 (this rank holds two equal chunks of it)");
        const int64_t start = positions.starts != nullptr ? positions.starts[b] : positions.offset;
        if (positions.starts != nullptr && start < 0)
            fail(std::string(name) + ".starts[" + std::to_string(b) + "]", start, "must be >= 0");
        if (length == 0) continue;
        // The unsharded sequence is cp_size times as long: its last position is what HF's max sees.
        const int64_t end = positions_end(positions.starts != nullptr ? std::string(name) + ".starts[" + std::to_string(b) + "]"
                                                                      : std::string(name) + ".offset",
                                          start, length, positions.cp_size);
        facts.max_position = std::max(facts.max_position, end);
        facts.largest = std::max(facts.largest, end - 1);
    }
    if (cu[positions.sequences] != seq)
        fail(std::string(name) + ".cu_seqlens[" + std::to_string(positions.sequences) + "]", cu[positions.sequences],
             "must equal total tokens = " + std::to_string(seq));
}

}  // namespace

detail::PositionFacts detail::check_positions(std::string_view name, const Positions& positions, int64_t batch,
                                              int64_t seq, Device device, const RopeConfig& config, bool table) {
    PositionFacts facts;
    facts.source.seq = seq;
    const int64_t config_axes = config.multi_axis.axes();
    if (positions.cp_size < 1) fail(std::string(name) + ".cp_size", positions.cp_size, "must be >= 1");
    if (positions.cp_rank < 0 || positions.cp_rank >= positions.cp_size)
        fail(std::string(name) + ".cp_rank", positions.cp_rank,
             "must be in [0, cp_size) = [0, " + std::to_string(positions.cp_size) + ")");
    facts.source.cp_size = positions.cp_size;
    facts.source.cp_rank = positions.cp_rank;
    if (positions.offset < 0) fail(std::string(name) + ".offset", positions.offset, "must be >= 0");
    facts.source.offset = positions.offset;
    if (positions.ids == nullptr && positions.axes != 1)
        fail(std::string(name) + ".axes", positions.axes, "must be 1 without ids (only explicit ids have several rows)");
    if (positions.ids == nullptr && config.multi_axis.assignment == AxisAssignment::axial)
        fail(std::string(name) + ".ids", "null",
             "axial RoPE needs explicit coordinates (ids with " + std::to_string(config_axes) + " axis rows)");
    if (positions.cu_seqlens == nullptr && positions.sequences != 0)
        fail(std::string(name) + ".sequences", positions.sequences, "must be 0 without cu_seqlens");
    if (positions.cu_seqlens == nullptr && positions.starts != nullptr)
        fail(std::string(name) + ".starts", "set", "is only read with cu_seqlens (packed sequences)");
    if (positions.cu_seqlens != nullptr && positions.ids != nullptr)
        fail(std::string(name) + ".ids", "set", "must be null with cu_seqlens (packed ids are one row of ids: use ids alone)");

    const bool arrays = positions.ids != nullptr || positions.cu_seqlens != nullptr;
    if (arrays) check_device(std::string(name) + ".device", positions.device, device);
    if (positions.cu_seqlens != nullptr) {  // First: check_packed refuses ids given with cu_seqlens.
        check_packed(name, positions, batch, seq, facts);
    } else if (positions.ids != nullptr) {
        check_ids(name, positions, batch, seq, config_axes, facts);
    } else {
        if (positions.cp_size > 1 && seq % 2 != 0)
            fail("seq", seq, "must be even with cp_size > 1 (this rank holds two equal chunks of each sequence)");
        // The unsharded sequence is cp_size times as long.
        facts.max_position = positions_end(std::string(name) + ".offset", positions.offset, seq, positions.cp_size);
        facts.largest = seq > 0 ? facts.max_position - 1 : -1;
    }
    if (arrays && positions.device != Device::host) {
        if (positions.max_position < 0)
            fail(std::string(name) + ".max_position", positions.max_position, "must be >= 0 (0 means unknown)");
        // A caller's table replaces the frequencies, so their length is not needed then.
        if (length_dependent(config.scaling.type) && !table && positions.max_position == 0)
            fail(std::string(name) + ".max_position", positions.max_position,
                 std::string("must be given (largest position + 1) for device-resident positions with scaling type ") +
                     std::string(scaling_type_name(config.scaling.type)) + ", whose frequencies depend on the length");
        // The caller's bound, as rope would have computed it from host arrays.
        facts.max_position = positions.max_position;
    }
    return facts;
}

namespace {

// A caller's cos/sin table: float32 [rows, rotary_dim] on the backend's device.
CosSinTable check_table(const CosSinCache& cache, int64_t rotary_dim, Device device, int64_t largest,
                        std::string_view positions_name) {
    if (cache.data == nullptr) return {};
    if (cache.dtype != DType::f32)
        fail("cos_sin_cache.dtype", dtype_name(cache.dtype), "must be fp32 (fp16/bf16 tables lose accuracy)");
    check_device("cos_sin_cache.device", cache.device, device);
    if (reinterpret_cast<uintptr_t>(cache.data) % 4 != 0)
        fail("cos_sin_cache.data", cache.data, "must be aligned to 4 bytes (the size of an fp32 element)");
    if (cache.rows <= 0) fail("cos_sin_cache.rows", cache.rows, "must be > 0");
    if (cache.cols != rotary_dim)
        fail("cos_sin_cache.cols", cache.cols,
             "must equal rotary_dim = " + std::to_string(rotary_dim) + " (cos of each pair, then sin of each pair)");
    const int64_t row_stride = cache.row_stride == 0 ? cache.cols : cache.row_stride;
    if (row_stride < cache.cols)
        fail("cos_sin_cache.row_stride", cache.row_stride, "must be >= cols = " + std::to_string(cache.cols) + " (or 0)");
    // Any scaling and precise_angles are accepted: they describe how the table was built
    // (make_cos_sin_cache), and make_plan applies neither the config's frequencies nor its
    // attention factor on top of a table, so nothing can be applied twice.
    if (largest >= cache.rows)
        fail(positions_name, "largest " + std::to_string(largest),
             "must be < cos_sin_cache.rows = " + std::to_string(cache.rows) + " (the table has no row for it)");
    return CosSinTable{static_cast<const float*>(cache.data), cache.rows, row_stride, rotary_dim / 2};
}

// The angles a call computes must exist in float32. A base or a scaling factor
// that is valid on its own (finite, > 0) can still give a theta_i that float32
// cannot hold (base 1e-45: theta_i = 1e45^(2i/d)), or an angle
// float32(position) * theta_i past its range at this call's largest position
// (known for host positions): either would rotate by NaN. A caller's table
// replaces the angles, so then nothing is checked.
void check_angles(const FrequencyTable& frequencies, const RopeConfig& config, int64_t largest, bool table,
                  std::string_view positions_name = "positions") {
    if (table) return;
    // The base as fail() prints numbers (1e-45, not std::to_string's 0.000000); built only for a failure.
    const auto source = [&] {
        return "(from base = " + to_text(config.base) + " and scaling " +
               std::string(scaling_type_name(config.scaling.type)) + ")";
    };
    float largest_theta = 0.0f;
    for (size_t i = 0; i < frequencies.inv_freq.size(); ++i) {
        if (!std::isfinite(frequencies.inv_freq[i]))
            fail("theta_" + std::to_string(i), frequencies.inv_freq[i], "is not finite in float32 " + source());
        largest_theta = std::max(largest_theta, frequencies.inv_freq[i]);
    }
    if (!std::isfinite(frequencies.attention_factor))
        fail("attention factor", frequencies.attention_factor, "is not finite in float32 " + source());
    if (!config.precise_angles && largest > 0 && !std::isfinite(static_cast<float>(largest) * largest_theta))
        fail(positions_name, "largest " + std::to_string(largest),
             "times the largest theta " + source() + " overflows float32");
}

}  // namespace

Plan make_plan(const RopeConfig& config, const RopeArgs& args, Device device, const FrequencyTable* frequencies) {
    return detail::make_plan(config, args, device, frequencies, "positions");
}

Plan detail::make_plan(const RopeConfig& config, const RopeArgs& args, Device device, const FrequencyTable* frequencies,
                       std::string_view positions_name) {
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

    const int64_t rotary_dim = config.effective_rotary_dim();
    const PositionFacts facts = detail::check_positions(positions_name, args.positions, q.batch, q.seq, device, config,
                                                        args.cos_sin_cache.data != nullptr);
    const CosSinTable table = check_table(args.cos_sin_cache, rotary_dim, device, facts.largest, positions_name);

    Plan plan;
    plan.style = config.style;
    // The inverse of a reordering style reads its output order and writes its input order.
    if (args.direction == Direction::inverse && reorders(config.style))
        plan.style = config.style == Style::interleaved_to_half ? Style::half_to_interleaved : Style::interleaved_to_half;
    plan.dtype = dtype;
    plan.device = device;
    plan.batch = q.batch;
    plan.seq = q.seq;
    plan.head_dim = q.head_dim;
    plan.rotary_dim = rotary_dim;
    plan.pairs = rotary_dim / 2;
    plan.rotary_offset = config.rotary_offset;
    plan.axes = config.multi_axis.axes();
    plan.q = Operand{args.q.data, args.q_out.data, q, args.q_out.geometry()};
    plan.k = Operand{args.k.data, args.k_out.data, k, args.k_out.geometry()};
    static_cast<PositionForm&>(plan.positions) = facts.source;  // Not relative: make_plan plans no re-rotation.
    plan.stream = args.stream;
    // An empty call is a valid no-op that no backend runs: it gets no angles
    // (for a huge head_dim the frequency table alone would take gigabytes).
    if (plan.empty()) return plan;

    // The frequencies: the caller's table of this configuration, shared by all its calls
    // (a pow per pair saved), or computed for this call (the only way for length-dependent
    // scaling, whose table depends on the call's largest position).
    FrequencyTable built;
    if (frequencies == nullptr || length_dependent(config.scaling.type)) {
        built = detail::build_frequency_table(config, facts.max_position);
        frequencies = &built;
    }
    check_angles(*frequencies, config, facts.largest, table.data != nullptr, positions_name);
    plan.angles.inv_freq = frequencies->inv_freq;
    plan.angles.inv_freq_low = frequencies->inv_freq_low;
    plan.angles.pair_axis = frequencies->pair_axis;
    plan.angles.precise = config.precise_angles;
    plan.angles.table = table;
    // A caller's table already holds any attention factor; the inverse negates sin either way.
    const float scale = table.data != nullptr ? 1.0f : frequencies->attention_factor;
    plan.angles.cos_scale = scale;
    plan.angles.sin_scale = (args.direction == Direction::forward ? 1.0f : -1.0f) * scale;
    return plan;
}

std::vector<float> make_cos_sin_cache(const RopeConfig& config, int64_t rows, int64_t max_position) {
    validate(config);
    const int64_t rotary_dim = config.effective_rotary_dim();
    const int64_t pairs = rotary_dim / 2;
    if (rows <= 0) fail("rows", rows, "must be > 0 (the positions the table covers)");
    if (rows > kMaxCosSinCacheFloats / rotary_dim)
        fail("rows", rows,
             "times rotary_dim = " + std::to_string(rotary_dim) +
                 " is more than 2^31 floats (8 GiB), the most a table may hold");
    if (max_position < 0) fail("max_position", max_position, "must be >= 0");
    if (length_dependent(config.scaling.type) && max_position == 0)
        fail("max_position", max_position,
             "must be given (> 0) with scaling type " + std::string(scaling_type_name(config.scaling.type)) +
                 ": its frequencies depend on the largest position + 1 a call reaches, and the table holds those "
                 "of one such length");
    const FrequencyTable frequencies = detail::build_frequency_table(config, max_position);
    check_angles(frequencies, config, rows - 1, /*table=*/false);  // As a call reaching rows - 1 would be checked.

    // The backends' own rule, attention factor on both cos and sin, forward direction.
    AngleRule rule;
    rule.inv_freq = frequencies.inv_freq;
    rule.inv_freq_low = frequencies.inv_freq_low;
    rule.precise = config.precise_angles;
    rule.cos_scale = rule.sin_scale = frequencies.attention_factor;
    std::vector<float> table(static_cast<size_t>(rows * rotary_dim));
    for (int64_t p = 0; p < rows; ++p) {
        float* row = table.data() + p * rotary_dim;
        for (int64_t i = 0; i < pairs; ++i) rotation_factors(rule, p, i, row[i], row[pairs + i]);
    }
    return table;
}

namespace detail {

void refuse_window_and_reordering(const RopeConfig& config, std::string_view call) {
    if (config.rotary_offset != 0)
        fail("config.rotary_offset", config.rotary_offset,
             "must be 0 for " + std::string(call) +
                 ": its fused loops rotate from the head's first feature (rotate a window with rope::apply)");
    if (config.style == Style::interleaved_to_half || config.style == Style::half_to_interleaved)
        fail("config.style", style_name(config.style),
             "is not taken by " + std::string(call) +
                 ": its fused loops write each pair where they read it (use neox or gptj; HF's DeepSeek order "
                 "runs through rope::apply)");
}

std::vector<Plan> window_parts(const Plan& plan) {
    if (plan.rotary_offset == 0) return {plan};
    const int64_t offset = plan.rotary_offset;
    std::vector<Plan> parts;
    // Features [0, offset): copied for an operand with an output of its own, nothing to do in place.
    Plan copy = plan;
    copy.style = Style::half_split;  // No pair rotates: any style would do.
    copy.rotary_dim = copy.pairs = copy.rotary_offset = 0;
    copy.head_dim = offset;
    copy.angles.inv_freq.clear();
    copy.angles.inv_freq_low.clear();
    copy.angles.pair_axis.clear();
    for (Operand* operand : {&copy.q, &copy.k}) {
        operand->in_geometry.head_dim = operand->out_geometry.head_dim = offset;
        if (operand->in == operand->out) operand->in_geometry.heads = operand->out_geometry.heads = 0;
    }
    if (!copy.empty()) parts.push_back(std::move(copy));
    // Features [offset, head_dim): rows that start at the window.
    Plan window = plan;
    window.rotary_offset = 0;
    window.head_dim = plan.head_dim - offset;
    const int64_t element = dtype_size(plan.dtype);
    for (Operand* operand : {&window.q, &window.k}) {
        operand->in_geometry.head_dim = operand->out_geometry.head_dim = window.head_dim;
        if (operand->in_geometry.numel() == 0) continue;  // No memory to point into (the pointer may be null).
        operand->in = static_cast<const char*>(operand->in) + offset * operand->in_geometry.stride_dim * element;
        operand->out = static_cast<char*>(operand->out) + offset * operand->out_geometry.stride_dim * element;
    }
    parts.push_back(std::move(window));
    return parts;
}

std::optional<FrequencyTable> reusable_frequency_table(const RopeConfig& config) {
    validate(config);
    if (length_dependent(config.scaling.type)) return std::nullopt;
    return build_frequency_table(config, 0);  // Any max_position: the table does not read it.
}

}  // namespace detail

}  // namespace rope

#include "random_call.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "rope/detail/plan.hpp"

namespace random_call {
namespace {

using rope::DType;
using rope::Layout;

// ---------------------------------------------------------------------------
// Numbers as a fuzzer should try them: mostly plausible, sometimes extreme
// ---------------------------------------------------------------------------

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

// Where integer code breaks: signs, the 32-bit boundaries, 64-bit overflow.
constexpr int64_t kEdgeIntegers[] = {kInt64Min, kInt64Min + 1, -(int64_t(1) << 32), -2, -1, 0, 1,
                                     (int64_t(1) << 31) - 1, int64_t(1) << 31, int64_t(1) << 32,
                                     int64_t(1) << 62, kInt64Max - 1, kInt64Max};

// Where floating-point code breaks: zeros, subnormals, float32's range, inf, NaN.
constexpr double kEdgeReals[] = {0.0, -0.0, -1.0, 1.0, 5e-324, 1e-300, 1e-45, 3.5e38, 1e300,
                                 std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                                 std::numeric_limits<double>::quiet_NaN()};

template <typename T, size_t N>
T pick(Source& in, const T (&choices)[N]) {
    return choices[in.integer_in(0, int64_t(N) - 1)];
}
template <typename T>
T pick(Source& in, std::initializer_list<T> choices) {
    return *(choices.begin() + in.integer_in(0, int64_t(choices.size()) - 1));
}
bool coin(Source& in) { return (in.integer_in(0, 255) & 1) != 0; }  // FuzzedDataProvider::ConsumeBool

// An integer in [low, high] (high below low counts as low). From a hostile
// source, sometimes an edge value or any int64 at all.
int64_t integer(Source& in, int64_t low, int64_t high) {
    high = std::max(high, low);
    if (!in.hostile) return in.integer_in(low, high);
    const int64_t kind = in.integer_in(0, 255);
    if (kind < 232) return in.integer_in(low, high);
    if (kind < 250) return pick(in, kEdgeIntegers);
    return in.any_integer();
}

// A real number in [low, high]; from a hostile source, sometimes an edge value or any double.
double real(Source& in, double low, double high) {
    if (!in.hostile) return in.real_in(low, high);
    const int64_t kind = in.integer_in(0, 255);
    if (kind < 232) return in.real_in(low, high);
    if (kind < 250) return pick(in, kEdgeReals);
    return in.any_real();
}

// True once in @p n draws (on a fuzzer's exhausted input: never).
bool rarely(Source& in, int n) { return in.integer_in(0, n - 1) == n - 1; }
// The same, for a choice that makes the call wrong: never from a valid source (which draws nothing for it).
bool wrong(Source& in, int n) { return in.hostile && rarely(in, n); }

// `parts` non-negative numbers summing to `total`, in random proportions.
std::vector<int64_t> partition(Source& in, int64_t total, int64_t parts) {
    total = std::max<int64_t>(total, 0);
    std::vector<int64_t> cuts{0, total};
    for (int64_t i = 1; i < parts; ++i) cuts.push_back(in.integer_in(0, total));
    std::sort(cuts.begin(), cuts.end());
    std::vector<int64_t> sizes;
    for (size_t i = 1; i < cuts.size(); ++i) sizes.push_back(cuts[i] - cuts[i - 1]);
    return sizes;
}

// Logical sizes of q (or k): a view of them is built in some layout.
struct Sizes {
    int64_t batch, heads, seq, head_dim;
};

DType draw_dtype(Source& in) { return pick(in, {DType::f32, DType::f16, DType::bf16}); }
Layout draw_layout(Source& in) { return pick(in, {Layout::bhsd, Layout::bshd, Layout::thd}); }

rope::Scaling draw_scaling(Source& in, int64_t pairs) {
    using rope::ScalingType;
    rope::Scaling s;
    s.type = pick(in, {ScalingType::none, ScalingType::none, ScalingType::linear, ScalingType::dynamic,
                       ScalingType::yarn, ScalingType::llama3, ScalingType::longrope});
    // Every field is drawn whatever the type (validation ignores those the
    // type does not read), so the fuzzer's bytes mean the same after a mutation of the type.
    s.factor = real(in, 0.25, 64.0);
    // Small: positions reach past it, so dynamic and longrope take their long-context branch too.
    s.original_max_position_embeddings = integer(in, in.hostile ? 1 : 2, 64);
    if (rarely(in, 4)) s.attention_factor = real(in, 0.1, 4.0);
    s.beta_fast = real(in, 1.0, 64.0);
    s.beta_slow = real(in, 0.05, 4.0);
    s.truncate = coin(in);
    if (rarely(in, 3)) s.mscale = real(in, 0.0, 2.0), s.mscale_all_dim = real(in, 0.0, 2.0);
    s.low_freq_factor = real(in, 0.5, 2.0);
    s.high_freq_factor = real(in, 1.0, 8.0);
    if (s.type == ScalingType::longrope || wrong(in, 16)) {
        // One divisor per pair, or (hostile) a list of the wrong length.
        const int64_t count = wrong(in, 8) ? in.integer_in(0, pairs + 2) : pairs;
        for (int64_t i = 0; i < count; ++i) s.short_factor.push_back(real(in, 0.5, 8.0));
        for (int64_t i = 0; i < count; ++i) s.long_factor.push_back(real(in, 0.5, 8.0));
    }
    if (!in.hostile) {  // What validation requires of the fields the type reads.
        if (s.type != ScalingType::yarn && s.type != ScalingType::longrope) s.attention_factor.reset();
        s.beta_fast += s.beta_slow;
        s.high_freq_factor += s.low_freq_factor;
    }
    return s;
}

rope::MultiAxis draw_multi_axis(Source& in, int64_t pairs) {
    using rope::AxisAssignment;
    rope::MultiAxis m;
    m.assignment = pick(in, {AxisAssignment::single, AxisAssignment::single, AxisAssignment::mrope_contiguous,
                             AxisAssignment::mrope_interleaved, AxisAssignment::axial});
    if (m.assignment == AxisAssignment::single && !wrong(in, 16)) return m;
    const bool mrope = m.assignment != AxisAssignment::axial && m.assignment != AxisAssignment::single;
    const int64_t count = wrong(in, 8) ? in.integer_in(0, 6)
                          : mrope      ? 3
                                       : in.integer_in(1, in.hostile ? rope::kMaxPositionAxes
                                                                     : std::min<int64_t>(rope::kMaxPositionAxes, pairs));
    if (wrong(in, 8)) {
        for (int64_t a = 0; a < count; ++a) m.sections.push_back(integer(in, 0, pairs));
    } else if (in.hostile || m.assignment != AxisAssignment::mrope_interleaved) {
        // Each axis at least one pair when valid (pairs >= count, or the call stays single).
        if (!in.hostile && pairs < count) return rope::MultiAxis{};
        for (int64_t part : partition(in, in.hostile ? pairs : pairs - count, count))
            m.sections.push_back(in.hostile ? part : part + 1);
    } else {
        // Height takes pairs 1, 4, ... and width 2, 5, ...: both must stay below pairs.
        if (pairs < 3) return rope::MultiAxis{};
        const int64_t height = in.integer_in(1, (pairs - 2) / 3 + 1), width = in.integer_in(1, (pairs - 3) / 3 + 1);
        m.sections = {pairs - height - width, height, width};
    }
    return m;
}

rope::RopeConfig draw_config(Source& in) {
    rope::RopeConfig c;
    // Mostly small heads; sometimes long enough (> 1024 features) for cpu-eigen's
    // fp16/bf16 rows to skip their float32 stack copy.
    c.head_dim = coin(in) ? in.integer_in(1, 48) : integer(in, 1, 1100);
    if (!in.hostile) c.head_dim += c.head_dim % 2;  // rotary_dim 0 means head_dim: even
    switch (in.integer_in(0, in.hostile ? 2 : 1)) {
        case 0: c.rotary_dim = 0; break;
        case 1: c.rotary_dim = 2 * in.integer_in(1, std::max<int64_t>(1, c.head_dim / 2)); break;
        default: c.rotary_dim = integer(in, -2, std::min<int64_t>(c.head_dim, 4096) + 2); break;
    }
    c.base = coin(in) ? pick(in, {10000.0, 500000.0, 1e6, 100.0, 2.0}) : real(in, 1.5, 1e7);
    c.style = coin(in) ? rope::Style::half_split : rope::Style::interleaved;
    c.precise_angles = rarely(in, 4);
    // The resolved rotary_dim may be anything here: validation judges it, the
    // generator only needs a sane count of pairs to size lists with.
    const int64_t rotary = c.effective_rotary_dim();
    const int64_t pairs = rotary > 0 && rotary <= 4096 ? rotary / 2 : 1;
    c.scaling = draw_scaling(in, pairs);
    c.multi_axis = draw_multi_axis(in, pairs);
    // Axial RoPE restarts its frequencies on each axis: no scaling.
    if (!in.hostile && c.multi_axis.assignment == rope::AxisAssignment::axial) c.scaling = rope::Scaling{};
    return c;
}

// A view of @p sizes in @p layout with strides of one of four kinds: dense,
// padded (gaps after each axis, features spaced apart), transposed (dense in
// another axis order) or (hostile) arbitrary. Hostile: sometimes one size is replaced too.
rope::TensorView draw_view(Source& in, Sizes sizes, DType dtype, Layout layout) {
    rope::TensorView view;
    view.dtype = wrong(in, 32) ? draw_dtype(in) : dtype;
    view.device = wrong(in, 64) ? rope::Device::cuda : rope::Device::host;
    view.layout = layout;
    if (layout == Layout::thd) view.shape = {sizes.seq, sizes.heads, sizes.head_dim, 1};
    else if (layout == Layout::bhsd) view.shape = {sizes.batch, sizes.heads, sizes.seq, sizes.head_dim};
    else view.shape = {sizes.batch, sizes.seq, sizes.heads, sizes.head_dim};
    if (wrong(in, 16)) view.shape[size_t(in.integer_in(0, 3))] = integer(in, 0, 8);

    const int axes = layout == Layout::thd ? 3 : 4;  // thd's fourth axis is a unit axis
    std::array<int, 4> order{0, 1, 2, 3};            // outermost first
    int64_t dim_stride = 1;
    std::array<int64_t, 4> pad{};
    switch (in.integer_in(0, in.hostile ? 3 : 2)) {
        case 0: break;  // dense
        case 1:         // padded (valid: sometimes by multiples of 8, which keeps dense rows 16-byte aligned)
            dim_stride = in.integer_in(1, 3);
            for (int64_t& p : pad) p = in.integer_in(0, 3) * (in.hostile || coin(in) ? 1 : 8);
            break;
        case 2:  // transposed: a random order of the axes
            for (int i = axes - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(in.integer_in(0, i))]);
            break;
        default:  // arbitrary
            for (int64_t& stride : view.strides) stride = integer(in, 0, 64);
            return view;
    }
    // Row-major in `order`: each axis steps over the axes inside it, plus its
    // padding. (In unsigned arithmetic: with a huge size it wraps, and the
    // strides are then just more arbitrary numbers for validation to judge.)
    uint64_t stride = uint64_t(dim_stride);
    for (int i = axes - 1; i >= 0; --i) {
        const int axis = order[size_t(i)];
        view.strides[size_t(axis)] = int64_t(stride);
        stride = stride * uint64_t(std::max<int64_t>(view.shape[size_t(axis)], 1)) + uint64_t(pad[size_t(axis)]);
    }
    if (axes == 3) view.strides[3] = integer(in, 0, 4);  // never used: any value
    return view;
}

// Where an operand starts: its own region, or (hostile, for the operands that
// come later) inside an earlier one: partial overlaps and misaligned pointers.
// Valid: sometimes one element into its region (off 16-byte alignment), and
// sometimes storage after its last element.
Placement draw_placement(Source& in, int own_region, int64_t element_bytes) {
    if (!in.hostile) {
        if (own_region == kCache) return {kCache, 0, 0};
        return {own_region, element_bytes * in.integer_in(0, 1), element_bytes * in.integer_in(0, 2) * in.integer_in(0, 4)};
    }
    if (own_region == kQ || !rarely(in, 6)) return {own_region, 0, 0};
    const int earlier = int(in.integer_in(0, own_region - 1));
    return {earlier, in.integer_in(0, 4096), 0};
}

// Stands for an array of no elements: set (not null) but never read.
constexpr int64_t kNoElements[1] = {0};

// @p values as a position array: its own allocation of exactly that many int64.
const int64_t* exact_array(std::vector<int64_t>& storage, const std::vector<int64_t>& values) {
    storage = std::vector<int64_t>(values.begin(), values.end());
    return storage.empty() ? kNoElements : storage.data();
}

enum Form { kOffset, kIds, kMoreIds, kPacked, kNone };

// Most calls are valid, so most reach the backends; each part can be made
// wrong on its own (hostile), so each check of the validation is reached too.
// The arrays always hold as many ids as the fields say (a caller who lies
// about that is outside what any library can check). `form` is drawn here
// unless a valid call chose it already; `small` keeps every position below 128
// (a caller's table has a row for each).
void draw_positions(Source& in, Call& call, const Sizes& q, bool packed_layout, int form, bool small) {
    rope::Positions& p = call.positions;
    const int64_t axes = call.config.multi_axis.axes();
    const int64_t batch = packed_layout ? 1 : q.batch;
    const int64_t seq = q.seq;
    int64_t largest = coin(in) ? 64 : pick<int64_t>(in, {4096, 1 << 20, 1 << 24});
    if (small) largest = 16;
    // The cap on any position array: beyond it the pointer stays null (validation
    // then rejects the call), so rope never reads past an allocation of ours.
    constexpr int64_t kMaxArray = 1 << 14;
    if (form < 0) form = int(in.integer_in(0, 4));
    bool even = false;  // packed: every length even, as context parallelism needs
    switch (form) {
        case kOffset:
            p.offset = integer(in, 0, largest);
            break;
        case kIds:  // shared, per-sequence or multi-axis ids
        case kMoreIds: {
            p.axes = wrong(in, 8) ? integer(in, 0, 5) : axes;
            p.rows = wrong(in, 8) ? integer(in, 0, 4) : (coin(in) ? 1 : batch);
            p.length = wrong(in, 8) ? integer(in, 0, 16) : seq;
            int64_t count = 0;
            if (!__builtin_mul_overflow(p.axes, p.rows, &count) && !__builtin_mul_overflow(count, p.length, &count) &&
                count >= 0 && count <= kMaxArray) {
                std::vector<int64_t> ids;
                for (int64_t i = 0; i < count; ++i) ids.push_back(integer(in, 0, largest));
                p.ids = exact_array(call.ids, ids);
            }
            break;
        }
        case kPacked: {
            p.sequences = wrong(in, 8) ? integer(in, 0, 8) : in.integer_in(1, 6);
            if (p.sequences < 0 || p.sequences >= kMaxArray) break;
            even = coin(in);
            std::vector<int64_t> cu{0};
            if (wrong(in, 8)) {
                cu.clear();
                for (int64_t b = 0; b <= p.sequences; ++b) cu.push_back(integer(in, 0, seq));
            } else {
                for (int64_t length : partition(in, even ? seq / 2 : seq, p.sequences))
                    cu.push_back(cu.back() + (even ? 2 * length : length));
                cu.resize(size_t(p.sequences) + 1, cu.back());
                cu.back() = seq;  // an odd total keeps one odd length
                even = even && seq % 2 == 0;
            }
            p.cu_seqlens = exact_array(call.cu_seqlens, cu);
            if (coin(in)) {
                std::vector<int64_t> starts;
                for (int64_t b = 0; b < p.sequences; ++b) starts.push_back(integer(in, 0, largest));
                p.starts = exact_array(call.starts, starts);
            } else {
                p.offset = integer(in, 0, largest);
            }
            break;
        }
        default:  // nothing: positions 0 .. seq-1
            break;
    }
    if (rarely(in, 4)) {  // a context-parallel shard
        p.cp_size = wrong(in, 8) ? integer(in, 0, 8) : in.integer_in(1, 4);
        p.cp_rank = wrong(in, 8) ? integer(in, 0, 8) : in.integer_in(0, std::clamp<int64_t>(p.cp_size, 1, 8) - 1);
        // Valid shards: of one line of positions of even length, or of packed sequences of even lengths.
        const bool shardable = form == kPacked ? even : (form == kOffset || form == kNone) && seq % 2 == 0;
        if (!in.hostile && !shardable) p.cp_size = 1, p.cp_rank = 0;
    }
    if (wrong(in, 32)) p.device = rope::Device::cuda;
    if (wrong(in, 16)) p.max_position = integer(in, 0, largest);
}

void draw_cache(Source& in, Call& call, int64_t seq) {
    if (in.hostile) call.has_cache = rarely(in, 4);
    if (!call.has_cache) return;
    rope::CosSinCache& c = call.cache;
    const int64_t rotary = call.config.effective_rotary_dim();
    c.dtype = wrong(in, 32) ? draw_dtype(in) : DType::f32;
    c.device = wrong(in, 32) ? rope::Device::cuda : rope::Device::host;
    // Valid: a row for every position, sometimes a few more.
    c.rows = in.hostile ? integer(in, 1, 96) : largest_position(call.positions, seq) + 1 + in.integer_in(0, 3);
    c.cols = wrong(in, 8) ? integer(in, 0, 64) : rotary;
    switch (in.integer_in(0, in.hostile ? 3 : 2)) {
        case 0: c.row_stride = 0; break;
        case 1: c.row_stride = c.cols; break;
        case 2: c.row_stride = std::min<int64_t>(c.cols, 1 << 20) + in.integer_in(1, 5); break;
        default: c.row_stride = integer(in, 0, 80); break;
    }
}

}  // namespace

Call draw(Source& in) {
    Call call;
    call.config = draw_config(in);
    const DType dtype = draw_dtype(in);
    const Layout layout = draw_layout(in);
    // A valid call chooses its position form and table first: packed sequences
    // need a batch of 1; axial RoPE needs ids; a table excludes scaling and the
    // precise mode, and has a row for every position.
    int form = -1;
    if (!in.hostile) {
        call.has_cache = rarely(in, 4);
        if (call.has_cache) call.config.scaling = rope::Scaling{}, call.config.precise_angles = false;
        form = int(in.integer_in(0, 4));
        if (call.config.multi_axis.assignment == rope::AxisAssignment::axial) form = kIds;
    }
    // q's sizes; k has the same batch, seq and head_dim and a divisor of q's heads (or none).
    const int64_t head_dim = wrong(in, 16) ? integer(in, 0, 48) : call.config.head_dim;
    const int64_t low = in.hostile ? 0 : 1;  // valid calls are rarely empty (k may have no heads)
    Sizes q{form == kPacked && layout != Layout::thd ? 1 : integer(in, low, 3), 0, integer(in, low, 12), head_dim};
    const int64_t k_heads = in.integer_in(0, 3);
    q.heads = wrong(in, 16) ? integer(in, 0, 6) : std::max<int64_t>(k_heads, 1) * in.integer_in(1, 3);
    Sizes k = q;
    k.heads = k_heads;
    // Inputs first, then outputs: in place (the input's very view), or a view of
    // their own, in their own region or (hostile) overlapping another operand.
    const Layout k_layout = wrong(in, 8) ? draw_layout(in) : layout;
    call.views[kQ] = draw_view(in, q, dtype, layout);
    call.views[kK] = draw_view(in, k, dtype, k_layout);
    call.placements[kQ] = in.hostile ? Placement{kQ, 0, 0} : draw_placement(in, kQ, rope::dtype_size(dtype));
    call.placements[kK] = draw_placement(in, kK, rope::dtype_size(dtype));
    const bool in_place = coin(in);
    for (int out : {kQOut, kKOut}) {
        const int input = out - 2;
        if (in_place && !wrong(in, 8)) {
            call.views[size_t(out)] = call.views[size_t(input)];
            call.placements[size_t(out)] = call.placements[size_t(input)];
        } else {
            const Layout out_layout = wrong(in, 4) ? draw_layout(in) : call.views[size_t(input)].layout;
            call.views[size_t(out)] = draw_view(in, input == kQ ? q : k, dtype, out_layout);
            call.placements[size_t(out)] = draw_placement(in, out, rope::dtype_size(dtype));
        }
    }
    draw_positions(in, call, q, layout == Layout::thd, form, call.has_cache);
    draw_cache(in, call, q.seq);
    call.placements[kCache] = draw_placement(in, kCache, 4);
    call.direction = coin(in) ? rope::Direction::forward : rope::Direction::inverse;
    call.fill_seed = in.bits();
    return call;
}

std::string describe(const Call& call) {
    std::ostringstream text;
    const rope::RopeConfig& c = call.config;
    const rope::Scaling& s = c.scaling;
    text << "config: head_dim " << c.head_dim << " rotary_dim " << c.rotary_dim << " base " << c.base << " style "
         << rope::style_name(c.style) << (c.precise_angles ? " precise" : "") << " scaling "
         << rope::scaling_type_name(s.type) << " (factor " << s.factor << ", original "
         << s.original_max_position_embeddings << ", attention "
         << (s.attention_factor ? std::to_string(*s.attention_factor) : "unset") << ", beta " << s.beta_fast << "/"
         << s.beta_slow << ", mscale " << s.mscale << "/" << s.mscale_all_dim << ", freq factors "
         << s.low_freq_factor << "/" << s.high_freq_factor << ", lists " << s.short_factor.size() << "/"
         << s.long_factor.size() << ") multi_axis " << rope::axis_assignment_name(c.multi_axis.assignment) << " [";
    for (int64_t section : c.multi_axis.sections) text << " " << section;
    text << " ]\n";
    auto at = [&](int region) {
        const Placement& placement = call.placements[size_t(region)];
        return std::string(" at ") + kRegionNames[placement.region] + " + " + std::to_string(placement.byte_offset) +
               " bytes" + (placement.tail_bytes ? " (tail " + std::to_string(placement.tail_bytes) + ")" : "") + "\n";
    };
    for (int v = 0; v < 4; ++v) {
        const rope::TensorView& view = call.views[size_t(v)];
        text << kRegionNames[v] << ": " << rope::dtype_name(view.dtype) << " " << rope::device_name(view.device) << " "
             << rope::layout_name(view.layout) << " shape [" << view.shape[0] << ", " << view.shape[1] << ", "
             << view.shape[2] << ", " << view.shape[3] << "] strides [" << view.strides[0] << ", " << view.strides[1]
             << ", " << view.strides[2] << ", " << view.strides[3] << "]" << at(v);
    }
    const rope::Positions& p = call.positions;
    text << "positions: offset " << p.offset << " ids " << (p.ids ? "set" : "null") << " (" << call.ids.size()
         << ") axes " << p.axes << " rows " << p.rows << " length " << p.length << " cu_seqlens ["
         << (p.cu_seqlens ? "" : "null");
    for (int64_t v : call.cu_seqlens) text << " " << v;
    text << " ] sequences " << p.sequences << " starts [" << (p.starts ? "" : "null");
    for (int64_t v : call.starts) text << " " << v;
    text << " ] cp " << p.cp_rank << "/" << p.cp_size << " device " << rope::device_name(p.device) << " max_position "
         << p.max_position << "\n";
    if (call.has_cache)
        text << "cos_sin_cache: " << rope::dtype_name(call.cache.dtype) << " " << rope::device_name(call.cache.device)
             << " rows " << call.cache.rows << " cols " << call.cache.cols << " row_stride " << call.cache.row_stride
             << at(kCache);
    text << "direction " << (call.direction == rope::Direction::forward ? "forward" : "inverse") << "\n";
    return text.str();
}

int64_t largest_position(const rope::Positions& p, int64_t seq) {
    int64_t largest = 0;
    if (p.ids != nullptr) {
        for (int64_t i = 0; i < p.axes * p.rows * p.length; ++i) largest = std::max(largest, p.ids[i]);
    } else if (p.cu_seqlens != nullptr) {
        for (int64_t b = 0; b < p.sequences; ++b) {
            const int64_t length = p.cu_seqlens[b + 1] - p.cu_seqlens[b];
            const int64_t start = p.starts != nullptr ? p.starts[b] : p.offset;
            if (length > 0) largest = std::max(largest, start + length * p.cp_size - 1);
        }
    } else if (seq > 0) {
        largest = p.offset + seq * p.cp_size - 1;
    }
    return largest;
}

std::optional<int64_t> byte_extent(const rope::TensorView& view) {
    int64_t numel = 1, last = 0;
    for (size_t axis = 0; axis < 4; ++axis)
        if (view.shape[axis] < 0 || view.strides[axis] < 0) return std::nullopt;
    for (size_t axis = 0; axis < 4; ++axis)
        if (view.shape[axis] == 0) return 0;
    for (size_t axis = 0; axis < 4; ++axis)
        if (__builtin_mul_overflow(numel, view.shape[axis], &numel)) return std::nullopt;
    for (size_t axis = 0; axis < 4; ++axis) {
        int64_t reach = 0;
        if (__builtin_mul_overflow(view.shape[axis] - 1, view.strides[axis], &reach)) return std::nullopt;
        if (__builtin_add_overflow(last, reach, &last)) return std::nullopt;
    }
    int64_t bytes = 0;
    if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, rope::dtype_size(view.dtype), &bytes))
        return std::nullopt;
    return bytes;
}

std::optional<int64_t> byte_extent(const rope::CosSinCache& cache) {
    if (cache.rows <= 0 || cache.cols <= 0 || cache.row_stride < 0) return 0;
    int64_t last = 0, bytes = 0;
    if (__builtin_mul_overflow(cache.rows - 1, std::max(cache.row_stride, cache.cols), &last) ||
        __builtin_add_overflow(last, cache.cols, &last) || __builtin_mul_overflow(last, int64_t(4), &bytes))
        return std::nullopt;
    return bytes;
}

double storage_roundoff(DType dtype) {
    return dtype == DType::bf16 ? 1.0 / 256 : dtype == DType::f16 ? 1.0 / 2048 : 0.0;
}

bool oracle_computes(const rope::RopeConfig& config) {
    return config.scaling.type == rope::ScalingType::none || config.scaling.type == rope::ScalingType::linear;
}

double oracle_max_abs(const rope::RopeConfig& config, bool exact_angles, int64_t largest_position, DType dtype) {
    // theta_i = base^(-x) / factor with x in [0, 1) for every assignment (axial too).
    double largest_theta = std::max(1.0, 1.0 / config.base);
    if (config.scaling.type == rope::ScalingType::linear) largest_theta /= config.scaling.factor;
    // (At position 0 every angle is 0, whatever theta_i: a base of 5e-324 makes the bound on theta_i infinite.)
    const double angle_error =
        largest_position == 0 ? 0.0 : double(largest_position) * largest_theta * (exact_angles ? 4e-15 : 1.2e-7);
    return 1e-5 + 2.9 * angle_error + 2.9 * storage_roundoff(dtype);
}

double attention_factor(const rope::RopeConfig& config, const rope::RopeArgs& args) {
    return std::fabs(double(rope::make_plan(config, args, rope::Device::host).angles.cos_scale));
}

bool agrees(double got, double want, DType dtype, double attention) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want)) return got == want;
    return std::fabs(got - want) <=
           2 * storage_roundoff(dtype) * std::fabs(want) + 4e-6 * std::max({1.0, std::fabs(want), attention});
}

int64_t first_disagreement(const std::vector<double>& got, const std::vector<double>& want, DType dtype,
                           double attention) {
    for (size_t i = 0; i < want.size(); ++i)
        if (!agrees(got[i], want[i], dtype, attention)) return int64_t(i);
    return -1;
}

}  // namespace random_call

// Fuzz target `validation`: rope::apply's promise, on inputs no person would write.
//
// rope promises that a call either throws rope::Error and writes nothing, or
// rotates q and k correctly and writes nothing else. libFuzzer's bytes are
// decoded into one call: a RopeConfig (every scaling field, multi_axis and its
// sections, precise_angles), four tensor views (sizes, strides, dtypes,
// layouts including thd) placed in one guarded memory arena, so that outputs
// can be their inputs, separate, or partially overlapping them; positions in
// every form (offset, ids, multi-axis ids, packed cu_seqlens and starts,
// context-parallel shards); and an optional cos_sin_cache. Then:
//
//   - when every view fits in a small arena, rope::apply runs on cpu-naive and
//     on cpu-eigen, each from the same starting bytes. Both must throw
//     rope::Error, and then no byte of the arena or of the position arrays
//     changed; or both return, no byte outside the output elements changed,
//     the outputs equal the float64 oracle (tests/oracle.hpp) within the
//     tests' tolerance (for the scaling types the oracle computes: none and
//     linear), and cpu-eigen equals cpu-naive;
//   - otherwise (sizes or strides too large to allocate, or overflowing 64
//     bits) only the validation runs (rope::make_plan, which reads no tensor
//     memory): it must throw rope::Error or accept, and it must never accept a
//     view whose element offsets do not fit in int64.
//
// Anything else (another exception, a sanitizer report, a failed check)
// aborts, and libFuzzer keeps the input as a crash. The call is printed first,
// so a crash file explains itself: rope-fuzz-validation CRASH_FILE (with
// ROPE_FUZZ_PRINT=1 in the environment, every input's call is printed).
//
// Read top to bottom: numbers, the decoded call, the arena, the checks, the
// entry point.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "oracle.hpp"
#include "rope/detail/plan.hpp"
#include "rope/rope.hpp"

namespace {

using rope::DType;
using rope::Layout;

// ---------------------------------------------------------------------------
// 1. Numbers as a fuzzer should try them: mostly plausible, sometimes extreme
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

// An integer in [low, high] most of the time (what a caller would pass), else
// an edge value or any int64 at all. Exhausted input gives low. (high below
// low, from a size decoded as negative, counts as low.)
int64_t integer(FuzzedDataProvider& in, int64_t low, int64_t high) {
    high = std::max(high, low);
    const uint8_t kind = in.ConsumeIntegral<uint8_t>();
    if (kind < 232) return in.ConsumeIntegralInRange<int64_t>(low, high);
    if (kind < 250) return in.PickValueInArray(kEdgeIntegers);
    return in.ConsumeIntegral<int64_t>();
}

// A real number in [low, high] most of the time, else an edge value or any double.
double real(FuzzedDataProvider& in, double low, double high) {
    const uint8_t kind = in.ConsumeIntegral<uint8_t>();
    if (kind < 232) return in.ConsumeFloatingPointInRange<double>(low, high);
    if (kind < 250) return in.PickValueInArray(kEdgeReals);
    return in.ConsumeFloatingPoint<double>();
}

// True once in @p n draws (on exhausted input: never).
bool rarely(FuzzedDataProvider& in, int n) { return in.ConsumeIntegralInRange<int>(0, n - 1) == n - 1; }

// ---------------------------------------------------------------------------
// 2. The decoded call
// ---------------------------------------------------------------------------

// The four tensors and the table live in one arena, each in a region of its
// own between guard bytes. An operand may instead start inside an earlier
// region: that is how in-place, separate and partially overlapping calls all
// come out of the same decoder.
enum Region { kQ, kK, kQOut, kKOut, kCache, kRegions };
constexpr const char* kRegionNames[kRegions] = {"q", "k", "q_out", "k_out", "cos_sin_cache"};

struct Placement {
    int region = 0;           // The region whose start `data` is relative to.
    int64_t byte_offset = 0;  // Bytes past that start (reduced to the region's size when laid out).
};

// Logical sizes of q (or k): the decoder builds a view of them in some layout.
struct Sizes {
    int64_t batch, heads, seq, head_dim;
};

struct Call {
    rope::RopeConfig config;
    std::array<rope::TensorView, 4> views{};  // q, k, q_out, k_out; `data` is set when the arena is laid out.
    std::array<Placement, kRegions> placements{};
    bool has_cache = false;
    rope::CosSinCache cache{};                 // `data` set with the arena, when has_cache.
    std::vector<int64_t> ids, cu_seqlens, starts;  // The position arrays (allocated at their exact size: ASan sees any overread).
    rope::Positions positions{};               // Points into the arrays above.
    rope::Direction direction = rope::Direction::forward;
    uint64_t fill_seed = 0;                    // Seeds the arena's guard pattern and the input values.
};

DType decode_dtype(FuzzedDataProvider& in) { return in.PickValueInArray({DType::f32, DType::f16, DType::bf16}); }

rope::Scaling decode_scaling(FuzzedDataProvider& in, int64_t pairs) {
    rope::Scaling s;
    s.type = in.PickValueInArray({rope::ScalingType::none, rope::ScalingType::none, rope::ScalingType::linear,
                                  rope::ScalingType::dynamic, rope::ScalingType::yarn, rope::ScalingType::llama3,
                                  rope::ScalingType::longrope});
    // Every field is decoded whatever the type (validation ignores those the
    // type does not read), so the bytes mean the same after a mutation of the type.
    s.factor = real(in, 0.25, 64.0);
    // Small: positions reach past it, so dynamic and longrope take their long-context branch too.
    s.original_max_position_embeddings = integer(in, 1, 64);
    if (rarely(in, 4)) s.attention_factor = real(in, 0.1, 4.0);
    s.beta_fast = real(in, 1.0, 64.0);
    s.beta_slow = real(in, 0.05, 4.0);
    s.truncate = in.ConsumeBool();
    if (rarely(in, 3)) s.mscale = real(in, 0.0, 2.0), s.mscale_all_dim = real(in, 0.0, 2.0);
    s.low_freq_factor = real(in, 0.5, 2.0);
    s.high_freq_factor = real(in, 1.0, 8.0);
    if (s.type == rope::ScalingType::longrope || rarely(in, 16)) {
        // One divisor per pair, or (rarely) a list of the wrong length.
        const int64_t count = rarely(in, 8) ? in.ConsumeIntegralInRange<int64_t>(0, pairs + 2) : pairs;
        for (int64_t i = 0; i < count; ++i) s.short_factor.push_back(real(in, 0.5, 8.0));
        for (int64_t i = 0; i < count; ++i) s.long_factor.push_back(real(in, 0.5, 8.0));
    }
    return s;
}

// `parts` positive numbers summing to `total` (when total >= parts), in random proportions.
std::vector<int64_t> partition(FuzzedDataProvider& in, int64_t total, int64_t parts) {
    total = std::max<int64_t>(total, 0);
    std::vector<int64_t> cuts{0, total};
    for (int64_t i = 1; i < parts; ++i) cuts.push_back(in.ConsumeIntegralInRange<int64_t>(0, total));
    std::sort(cuts.begin(), cuts.end());
    std::vector<int64_t> sizes;
    for (size_t i = 1; i < cuts.size(); ++i) sizes.push_back(cuts[i] - cuts[i - 1]);
    return sizes;
}

rope::MultiAxis decode_multi_axis(FuzzedDataProvider& in, int64_t pairs) {
    rope::MultiAxis m;
    m.assignment = in.PickValueInArray({rope::AxisAssignment::single, rope::AxisAssignment::single,
                                        rope::AxisAssignment::mrope_contiguous,
                                        rope::AxisAssignment::mrope_interleaved, rope::AxisAssignment::axial});
    if (m.assignment == rope::AxisAssignment::single && !rarely(in, 16)) return m;
    const bool mrope = m.assignment == rope::AxisAssignment::mrope_contiguous ||
                       m.assignment == rope::AxisAssignment::mrope_interleaved;
    const int64_t count = rarely(in, 8) ? in.ConsumeIntegralInRange<int64_t>(0, 6)
                                        : (mrope ? 3 : in.ConsumeIntegralInRange<int64_t>(1, rope::kMaxPositionAxes));
    if (rarely(in, 8)) {
        for (int64_t a = 0; a < count; ++a) m.sections.push_back(integer(in, 0, pairs));
    } else {
        for (int64_t part : partition(in, pairs, count)) m.sections.push_back(part);
    }
    return m;
}

rope::RopeConfig decode_config(FuzzedDataProvider& in) {
    rope::RopeConfig c;
    // Mostly small heads; sometimes long enough (> 1024 features) for cpu-eigen's
    // fp16/bf16 rows to skip their float32 stack copy.
    c.head_dim = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 48) : integer(in, 1, 1100);
    switch (in.ConsumeIntegralInRange(0, 2)) {
        case 0: c.rotary_dim = 0; break;
        case 1: c.rotary_dim = 2 * in.ConsumeIntegralInRange<int64_t>(1, std::max<int64_t>(1, c.head_dim / 2)); break;
        default: c.rotary_dim = integer(in, -2, std::min<int64_t>(c.head_dim, 4096) + 2); break;
    }
    c.base = in.ConsumeBool() ? in.PickValueInArray({10000.0, 500000.0, 1e6, 100.0, 2.0})
                              : real(in, 1.5, 1e7);
    c.style = in.ConsumeBool() ? rope::Style::half_split : rope::Style::interleaved;
    c.precise_angles = rarely(in, 4);
    // The resolved rotary_dim may be anything here: validation judges it, the
    // decoder only needs a sane count of pairs to size lists with.
    const int64_t rotary = c.effective_rotary_dim();
    const int64_t pairs = rotary > 0 && rotary <= 4096 ? rotary / 2 : 1;
    c.scaling = decode_scaling(in, pairs);
    c.multi_axis = decode_multi_axis(in, pairs);
    return c;
}

// A view of @p sizes in @p layout with strides of one of four kinds: dense,
// padded (gaps after each axis, features spaced apart), transposed (dense in
// another axis order) or arbitrary. Sometimes one size is replaced too.
rope::TensorView decode_view(FuzzedDataProvider& in, Sizes sizes, DType dtype, Layout layout) {
    rope::TensorView view;
    view.dtype = rarely(in, 32) ? decode_dtype(in) : dtype;
    view.device = rarely(in, 64) ? rope::Device::cuda : rope::Device::host;
    view.layout = layout;
    if (layout == Layout::thd) view.shape = {sizes.seq, sizes.heads, sizes.head_dim, 1};
    else if (layout == Layout::bhsd) view.shape = {sizes.batch, sizes.heads, sizes.seq, sizes.head_dim};
    else view.shape = {sizes.batch, sizes.seq, sizes.heads, sizes.head_dim};
    if (rarely(in, 16)) view.shape[size_t(in.ConsumeIntegralInRange(0, 3))] = integer(in, 0, 8);

    const int axes = layout == Layout::thd ? 3 : 4;  // thd's fourth axis is a unit axis
    std::array<int, 4> order{0, 1, 2, 3};            // outermost first
    int64_t dim_stride = 1;
    std::array<int64_t, 4> pad{};
    switch (in.ConsumeIntegralInRange(0, 3)) {
        case 0: break;  // dense
        case 1:         // padded
            dim_stride = in.ConsumeIntegralInRange<int64_t>(1, 3);
            for (int64_t& p : pad) p = in.ConsumeIntegralInRange<int64_t>(0, 3);
            break;
        case 2:  // transposed: a random order of the axes
            for (int i = axes - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(in.ConsumeIntegralInRange(0, i))]);
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

// Where an operand starts: its own region, or (rarely, for the operands that
// come later) inside an earlier one: partial overlaps and misaligned pointers.
Placement decode_placement(FuzzedDataProvider& in, int own_region) {
    if (own_region == kQ || !rarely(in, 6)) return {own_region, 0};
    const int earlier = in.ConsumeIntegralInRange(0, own_region - 1);
    return {earlier, in.ConsumeIntegralInRange<int64_t>(0, 4096)};
}

// Stands for an array of no elements: set (not null) but never read.
constexpr int64_t kNoElements[1] = {0};

// @p values as a position array: its own allocation of exactly that many
// int64, so that AddressSanitizer reports a read one past the end.
const int64_t* exact_array(std::vector<int64_t>& storage, const std::vector<int64_t>& values) {
    storage = std::vector<int64_t>(values.begin(), values.end());
    return storage.empty() ? kNoElements : storage.data();
}

// Most calls are valid, so most reach the backends; each part can be made
// wrong on its own, so each check of the validation is reached too. The
// arrays always hold as many ids as the fields say (a caller who lies about
// that is outside what any library can check).
void decode_positions(FuzzedDataProvider& in, Call& call, const Sizes& q, bool packed_layout) {
    rope::Positions& p = call.positions;
    const int64_t axes = call.config.multi_axis.axes();
    const int64_t batch = packed_layout ? 1 : q.batch;
    const int64_t seq = q.seq;
    const int64_t largest = in.ConsumeBool() ? 64 : in.PickValueInArray<int64_t>({4096, 1 << 20, 1 << 24});
    // The cap on any position array: beyond it the pointer stays null (validation
    // then rejects the call), so rope never reads past an allocation of ours.
    constexpr int64_t kMaxArray = 1 << 14;
    switch (in.ConsumeIntegralInRange(0, 4)) {
        case 0:  // offset
            p.offset = integer(in, 0, largest);
            break;
        case 1:  // shared, per-sequence or multi-axis ids
        case 2: {
            p.axes = rarely(in, 8) ? integer(in, 0, 5) : axes;
            p.rows = rarely(in, 8) ? integer(in, 0, 4) : (in.ConsumeBool() ? 1 : batch);
            p.length = rarely(in, 8) ? integer(in, 0, 16) : seq;
            int64_t count = 0;
            if (!__builtin_mul_overflow(p.axes, p.rows, &count) && !__builtin_mul_overflow(count, p.length, &count) &&
                count >= 0 && count <= kMaxArray) {
                std::vector<int64_t> ids;
                for (int64_t i = 0; i < count; ++i) ids.push_back(integer(in, 0, largest));
                p.ids = exact_array(call.ids, ids);
            }
            break;
        }
        case 3: {  // packed sequences
            p.sequences = rarely(in, 8) ? integer(in, 0, 8) : in.ConsumeIntegralInRange<int64_t>(1, 6);
            if (p.sequences < 0 || p.sequences >= kMaxArray) break;
            const bool even = in.ConsumeBool();  // what context parallelism needs
            std::vector<int64_t> cu{0};
            if (rarely(in, 8)) {
                cu.clear();
                for (int64_t b = 0; b <= p.sequences; ++b) cu.push_back(integer(in, 0, seq));
            } else {
                for (int64_t length : partition(in, even ? seq / 2 : seq, p.sequences))
                    cu.push_back(cu.back() + (even ? 2 * length : length));
                cu.resize(size_t(p.sequences) + 1, cu.back());
                cu.back() = seq;  // an odd total keeps one odd length
            }
            p.cu_seqlens = exact_array(call.cu_seqlens, cu);
            if (in.ConsumeBool()) {
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
        p.cp_size = rarely(in, 8) ? integer(in, 0, 8) : in.ConsumeIntegralInRange<int64_t>(1, 4);
        p.cp_rank = rarely(in, 8) ? integer(in, 0, 8) : in.ConsumeIntegralInRange<int64_t>(0, std::clamp<int64_t>(p.cp_size, 1, 8) - 1);
    }
    if (rarely(in, 32)) p.device = rope::Device::cuda;
    if (rarely(in, 16)) p.max_position = integer(in, 0, largest);
}

void decode_cache(FuzzedDataProvider& in, Call& call) {
    call.has_cache = rarely(in, 4);
    if (!call.has_cache) return;
    rope::CosSinCache& c = call.cache;
    const int64_t rotary = call.config.effective_rotary_dim();
    c.dtype = rarely(in, 32) ? decode_dtype(in) : DType::f32;
    c.device = rarely(in, 32) ? rope::Device::cuda : rope::Device::host;
    c.rows = integer(in, 1, 96);
    c.cols = rarely(in, 8) ? integer(in, 0, 64) : rotary;
    switch (in.ConsumeIntegralInRange(0, 3)) {
        case 0: c.row_stride = 0; break;
        case 1: c.row_stride = c.cols; break;
        case 2: c.row_stride = std::min<int64_t>(c.cols, 1 << 20) + in.ConsumeIntegralInRange<int64_t>(1, 5); break;
        default: c.row_stride = integer(in, 0, 80); break;
    }
}

Call decode_call(FuzzedDataProvider& in) {
    Call call;
    call.config = decode_config(in);
    const DType dtype = decode_dtype(in);
    const Layout layout = in.PickValueInArray({Layout::bhsd, Layout::bshd, Layout::thd});
    // q's sizes; k has the same batch, seq and head_dim and a divisor of q's heads (or none).
    const int64_t head_dim = rarely(in, 16) ? integer(in, 0, 48) : call.config.head_dim;
    Sizes q{integer(in, 0, 3), 0, integer(in, 0, 12), head_dim};
    const int64_t k_heads = in.ConsumeIntegralInRange<int64_t>(0, 3);
    q.heads = rarely(in, 16) ? integer(in, 0, 6) : std::max<int64_t>(k_heads, 1) * in.ConsumeIntegralInRange<int64_t>(1, 3);
    Sizes k = q;
    k.heads = k_heads;
    // Inputs first, then outputs: in place (the input's very view), or a view of
    // their own, in their own region or (rarely) overlapping another operand.
    const Layout k_layout = rarely(in, 8) ? in.PickValueInArray({Layout::bhsd, Layout::bshd, Layout::thd}) : layout;
    call.views[kQ] = decode_view(in, q, dtype, layout);
    call.views[kK] = decode_view(in, k, dtype, k_layout);
    call.placements[kQ] = {kQ, 0};
    call.placements[kK] = decode_placement(in, kK);
    const bool in_place = in.ConsumeBool();
    for (int out : {kQOut, kKOut}) {
        const int input = out - 2;
        if (in_place && !rarely(in, 8)) {
            call.views[size_t(out)] = call.views[size_t(input)];
            call.placements[size_t(out)] = call.placements[size_t(input)];
        } else {
            const Layout out_layout = rarely(in, 4) ? in.PickValueInArray({Layout::bhsd, Layout::bshd, Layout::thd})
                                                    : call.views[size_t(input)].layout;
            call.views[size_t(out)] = decode_view(in, input == kQ ? q : k, dtype, out_layout);
            call.placements[size_t(out)] = decode_placement(in, out);
        }
    }
    decode_positions(in, call, q, layout == Layout::thd);
    decode_cache(in, call);
    call.placements[kCache] = decode_placement(in, kCache);
    call.direction = in.ConsumeBool() ? rope::Direction::forward : rope::Direction::inverse;
    call.fill_seed = in.ConsumeIntegral<uint64_t>();
    return call;
}

// The call in words, printed before any abort.
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
    for (int v = 0; v < 4; ++v) {
        const rope::TensorView& view = call.views[size_t(v)];
        text << kRegionNames[v] << ": " << rope::dtype_name(view.dtype) << " " << rope::device_name(view.device) << " "
             << rope::layout_name(view.layout) << " shape [" << view.shape[0] << ", " << view.shape[1] << ", "
             << view.shape[2] << ", " << view.shape[3] << "] strides [" << view.strides[0] << ", " << view.strides[1]
             << ", " << view.strides[2] << ", " << view.strides[3] << "] at " << kRegionNames[call.placements[size_t(v)].region]
             << " + " << call.placements[size_t(v)].byte_offset << " bytes\n";
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
             << " at " << kRegionNames[call.placements[kCache].region] << " + " << call.placements[kCache].byte_offset
             << " bytes\n";
    text << "direction " << (call.direction == rope::Direction::forward ? "forward" : "inverse") << "\n";
    return text.str();
}

[[noreturn]] void failure(const Call& call, const std::string& what) {
    std::fprintf(stderr, "\n=== rope-fuzz-validation: %s\n%s", what.c_str(), describe(call).c_str());
    std::abort();
}

// ---------------------------------------------------------------------------
// 3. The arena: every operand's bytes, between guard bytes
// ---------------------------------------------------------------------------

// Per operand: more than any plausible call needs, little enough that one
// input runs in about a millisecond.
constexpr int64_t kMaxRegionBytes = 1 << 16;
constexpr int64_t kGuardBytes = 64;  // before the first region, between regions, after the last

// Bytes from a view's first element to the end of its last; nothing when a size
// or stride is negative or the count does not fit in int64 (such views exist
// only as numbers, never in memory). 0 for an empty view.
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
    if (cache.rows <= 0 || cache.cols <= 0 || cache.row_stride < 0) return 0;  // validation rejects it unread
    int64_t last = 0, bytes = 0;
    if (__builtin_mul_overflow(cache.rows - 1, std::max(cache.row_stride, cache.cols), &last) ||
        __builtin_add_overflow(last, cache.cols, &last) || __builtin_mul_overflow(last, int64_t(4), &bytes))
        return std::nullopt;
    return bytes;
}

// Element (b, h, s, d) of a view, through its Geometry: the backends' own indexing.
uintptr_t element_address(const rope::TensorView& view, const rope::Geometry& g, int64_t b, int64_t h, int64_t s,
                          int64_t d) {
    return reinterpret_cast<uintptr_t>(view.data) + uintptr_t(g.offset(b, h, s, d) * rope::dtype_size(view.dtype));
}

template <typename Visit>
void for_each_element(const rope::TensorView& view, Visit&& visit) {
    if (view.numel() == 0) return;
    const rope::Geometry g = view.geometry();
    for (int64_t b = 0; b < g.batch; ++b)
        for (int64_t h = 0; h < g.heads; ++h)
            for (int64_t s = 0; s < g.seq; ++s)
                for (int64_t d = 0; d < g.head_dim; ++d) visit(element_address(view, g, b, h, s, d));
}

void store(uintptr_t address, DType dtype, float value) {
    rope::dispatch_dtype(dtype, [&](auto storage) {
        using Storage = decltype(storage);
        const Storage stored = rope::from_float<Storage>(value);
        std::memcpy(reinterpret_cast<void*>(address), &stored, sizeof stored);
    });
}

// splitmix64: a tiny, well-known generator, enough for guard bytes and inputs.
struct Random {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    // Uniform in [-2, -0.05] U [0.05, 2], as the tests' inputs: never zero.
    float input_value() {
        const float magnitude = 0.05f + 1.95f * float(next() >> 40) / float(1 << 24);
        return (next() & 1) ? -magnitude : magnitude;
    }
};

// The memory of one call. `run` is true when every operand fits and the
// backends can run; otherwise the views point at made-up addresses, far apart,
// that validation may look at but nothing reads.
struct Arena {
    bool run = false;
    std::vector<uint8_t> bytes;
    std::array<int64_t, kRegions> region_start{};  // byte offsets in `bytes`
    std::array<int64_t, kRegions> region_size{};
};

Arena lay_out(Call& call) {
    Arena arena;
    arena.run = true;
    for (int r = 0; r < kRegions; ++r) {
        const std::optional<int64_t> extent =
            r == kCache ? (call.has_cache ? byte_extent(call.cache) : std::optional<int64_t>(0))
                        : byte_extent(call.views[size_t(r)]);
        arena.run = arena.run && extent && *extent <= kMaxRegionBytes;
        // A view with zero strides has few bytes and may still have 2^40 elements to visit.
        if (r != kCache && extent) arena.run = arena.run && call.views[size_t(r)].numel() <= kMaxRegionBytes / 2;
        arena.region_size[size_t(r)] = extent ? *extent : 0;
    }
    uintptr_t base = 0;
    if (arena.run) {
        int64_t offset = kGuardBytes;
        for (int r = 0; r < kRegions; ++r) {
            arena.region_start[size_t(r)] = offset;
            // Regions start 64-byte aligned, as allocations do; only placements inside another region misalign.
            offset += (std::min(arena.region_size[size_t(r)], kMaxRegionBytes) + kGuardBytes + 63) / 64 * 64;
        }
        arena.bytes.assign(size_t(offset + kGuardBytes), 0);
        base = reinterpret_cast<uintptr_t>(arena.bytes.data());
    } else {
        // 2^44 bytes apart: distinct regions do not overlap unless an extent is that large.
        static uint8_t somewhere[64];
        base = reinterpret_cast<uintptr_t>(somewhere);
        for (int r = 0; r < kRegions; ++r) arena.region_start[size_t(r)] = int64_t(r) << 44;
    }
    auto address_of = [&](const Placement& placement) {
        const int64_t room = std::min(arena.region_size[size_t(placement.region)], kMaxRegionBytes);
        const int64_t offset = placement.byte_offset % (room + 1);  // inside, or just past, that region
        return reinterpret_cast<void*>(base + uintptr_t(arena.region_start[size_t(placement.region)] + offset));
    };
    for (int v = 0; v < 4; ++v) call.views[size_t(v)].data = address_of(call.placements[size_t(v)]);
    if (call.has_cache) call.cache.data = address_of(call.placements[kCache]);
    return arena;
}

// Guard pattern everywhere, NaN in every output element, random values in
// every input element, and in the table values no formula would produce
// (random, in [-1, 1]): the oracle reads the same table, so a lookup of the
// wrong row, pair or half cannot agree with it by luck.
// Returns false when the finished arena does not hold the inputs intact (an
// operand was written over by a later one): the call is then only validated.
bool fill(const Call& call, Arena& arena) {
    Random random{call.fill_seed};
    for (uint8_t& byte : arena.bytes) byte = uint8_t(random.next());
    for (int out : {kQOut, kKOut}) {
        const rope::TensorView& view = call.views[size_t(out)];
        for_each_element(view, [&](uintptr_t address) { store(address, view.dtype, NAN); });
    }
    for (int input : {kQ, kK}) {
        const rope::TensorView& view = call.views[size_t(input)];
        for_each_element(view, [&](uintptr_t address) { store(address, view.dtype, random.input_value()); });
    }
    if (!call.has_cache) return true;
    const rope::CosSinCache& cache = call.cache;
    const int64_t row_stride = std::max(cache.row_stride, cache.cols);
    auto* table = static_cast<uint8_t*>(const_cast<void*>(cache.data));
    if (cache.rows <= 0 || cache.cols <= 0 || cache.row_stride < 0) return true;
    for (int64_t p = 0; p < cache.rows; ++p) {
        for (int64_t j = 0; j < cache.cols; ++j) {
            const float value = random.input_value() / 2.0f;
            std::memcpy(table + 4 * (p * row_stride + j), &value, 4);
        }
    }
    // The table was written last: an input that shares its bytes no longer
    // holds input values (they may be NaN when read as fp16/bf16).
    const uintptr_t table_begin = reinterpret_cast<uintptr_t>(table);
    const uintptr_t table_end = table_begin + uintptr_t(*byte_extent(cache));
    bool intact = true;
    for (int input : {kQ, kK})
        for_each_element(call.views[size_t(input)], [&](uintptr_t address) {
            if (address + 4 > table_begin && address < table_end) intact = false;
        });
    return intact;
}

// ---------------------------------------------------------------------------
// 4. The checks
// ---------------------------------------------------------------------------

// Bytes of the arena the call may write: those of every output element.
std::vector<bool> writable_bytes(const Call& call, const Arena& arena) {
    std::vector<bool> writable(arena.bytes.size(), false);
    const uintptr_t base = reinterpret_cast<uintptr_t>(arena.bytes.data());
    for (int out : {kQOut, kKOut}) {
        const rope::TensorView& view = call.views[size_t(out)];
        for_each_element(view, [&](uintptr_t address) {
            for (int64_t i = 0; i < rope::dtype_size(view.dtype); ++i) writable[size_t(address - base) + size_t(i)] = true;
        });
    }
    return writable;
}

// The elements of a view as doubles, dense in (batch, heads, seq, dim) order.
// (Not by looping over an empty view: its other sizes may be 2^63.)
std::vector<double> values(const rope::TensorView& view) {
    return view.numel() == 0 ? std::vector<double>{} : oracle::values(view);
}

// Whether oracle::rotate (tests/oracle.hpp) computes this call: it knows every
// layout, position form and multi-axis assignment, and a caller's table, but
// of the scaling types only none and linear. The others (dynamic, yarn,
// llama3, longrope) only change the frequencies, which tests/scaling_test.cpp
// checks against HuggingFace's own; here cpu-eigen is compared with cpu-naive.
bool oracle_can_compute(const Call& call) {
    const rope::ScalingType type = call.config.scaling.type;
    return type == rope::ScalingType::none || type == rope::ScalingType::linear;
}

// Largest position of a call rope accepted (so every form is well formed), by
// the definitions of rope::Positions: the largest id; the last position of the
// longest sharded run (offset + seq * cp_size - 1, or per packed sequence,
// start + length * cp_size - 1).
int64_t largest_position(const Call& call, int64_t seq) {
    const rope::Positions& p = call.positions;
    int64_t largest = 0;
    if (p.ids != nullptr) {
        for (int64_t id : call.ids) largest = std::max(largest, id);
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

// Unit roundoff of the storage type: the rounding of the float32 result on store.
double storage_roundoff(DType dtype) {
    return dtype == DType::bf16 ? 1.0 / 256 : dtype == DType::f16 ? 1.0 / 2048 : 0.0;
}

// The largest absolute error against float64 that the call may have. It is
// the tests' bound (tests/support.hpp fp32_max_abs and the storage term of
// tests/differential_test.cpp), written for any frequencies: the angle
// position * theta_i carries a relative error of about 1.2e-7 in the float32
// default (theta_i rounded, then the product) and 4e-15 in the precise mode
// or with a table built in double; times the largest pair norm of our inputs
// (2.9 > 2 sqrt 2); plus 1e-5 for cos, sin and the products, and one rounding
// to the storage type.
double oracle_tolerance(const Call& call, int64_t largest_position, DType dtype) {
    const rope::RopeConfig& c = call.config;
    // theta_i = base^(-x) / factor with x in [0, 1) for every assignment (axial too).
    double largest_theta = std::max(1.0, 1.0 / c.base);
    if (c.scaling.type == rope::ScalingType::linear) largest_theta /= c.scaling.factor;
    const bool exact_angle = c.precise_angles || call.has_cache;
    const double angle_error =
        largest_position == 0 ? 0.0 : double(largest_position) * largest_theta * (exact_angle ? 4e-15 : 1.2e-7);
    return 1e-5 + 2.9 * angle_error + 2.9 * storage_roundoff(dtype);
}

// What a backend left in memory, and what the checks need of it.
struct Outcome {
    bool threw = false;
    std::string message;
    std::vector<double> q, k;  // the outputs, dense in (batch, heads, seq, dim) order
};

Outcome run_backend(rope::Backend& backend, const Call& call, Arena& arena, const std::vector<uint8_t>& start,
                    const rope::RopeArgs& args) {
    std::memcpy(arena.bytes.data(), start.data(), start.size());
    const std::vector<int64_t> ids = call.ids, cu_seqlens = call.cu_seqlens, starts = call.starts;
    Outcome outcome;
    try {
        rope::apply(backend, call.config, args);
    } catch (const rope::Error& error) {
        outcome.threw = true;
        outcome.message = error.what();
    }
    // Any other exception escapes to libFuzzer, which reports it as a crash.
    const std::string who = backend.name() + ": ";
    if (ids != call.ids || cu_seqlens != call.cu_seqlens || starts != call.starts)
        failure(call, who + "a position array changed");
    if (outcome.threw) {
        if (outcome.message.rfind("rope::Error: ", 0) != 0) failure(call, who + "malformed message: " + outcome.message);
        if (std::memcmp(arena.bytes.data(), start.data(), start.size()) != 0)
            failure(call, who + "threw (" + outcome.message + ") after writing to memory");
        return outcome;
    }
    const std::vector<bool> writable = writable_bytes(call, arena);
    for (size_t i = 0; i < start.size(); ++i) {
        if (!writable[i] && arena.bytes[i] != start[i]) {
            // Name the region the stray byte belongs to (or the guard it hit).
            std::string where = "a guard";
            for (int r = 0; r < kRegions; ++r)
                if (int64_t(i) >= arena.region_start[size_t(r)] &&
                    int64_t(i) < arena.region_start[size_t(r)] + arena.region_size[size_t(r)])
                    where = kRegionNames[r];
            failure(call, who + "wrote byte " + std::to_string(i) + " of the arena, in " + where +
                              ", outside the output elements");
        }
    }
    outcome.q = values(call.views[kQOut]);
    outcome.k = values(call.views[kKOut]);
    return outcome;
}

void check_against_oracle(const Call& call, const Outcome& outcome, const std::string& backend,
                          const std::vector<double>& want_q, const std::vector<double>& want_k, double tolerance) {
    for (int which = 0; which < 2; ++which) {
        const oracle::ErrorStats stats = oracle::compare(which == 0 ? outcome.q : outcome.k, which == 0 ? want_q : want_k);
        if (stats.non_finite > 0 || !(stats.max_abs <= tolerance))
            failure(call, backend + ": " + (which == 0 ? "q" : "k") + " differs from the oracle: max_abs " +
                              std::to_string(stats.max_abs) + " (tolerance " + std::to_string(tolerance) +
                              "), non-finite " + std::to_string(stats.non_finite));
    }
}

// The factor the call multiplies cos and sin by: yarn's and longrope's
// attention factor, 1 otherwise (rope::AngleRule::cos_scale). Only for a call
// cpu-naive ran, so one make_plan accepts.
double attention_factor(const Call& call, const rope::RopeArgs& args) {
    return std::fabs(double(rope::make_plan(call.config, args, rope::Device::host).angles.cos_scale));
}

// cpu-eigen must compute what cpu-naive computes: the same cos and sin (the
// shared rotation_factors), the same rotation; within one storage ulp, as in
// tests/differential_test.cpp, and non-finite exactly where cpu-naive is.
// cos and sin themselves may differ by a few float32 ulps (Eigen's routines
// against std::cos and std::sin), and the attention factor multiplies that
// difference before the products: an output of a few units can be the small
// difference of two terms 72 times larger (yarn with factor 1.8e308), so the
// absolute term grows with the factor (regression input
// yarn-attention-factor-scales-agreement).
void check_agreement(const Call& call, const Outcome& eigen, const Outcome& naive, DType dtype, double attention) {
    if (eigen.threw != naive.threw)
        failure(call, std::string("cpu-eigen ") + (eigen.threw ? "threw " + eigen.message : "returned") +
                          ", cpu-naive " + (naive.threw ? "threw " + naive.message : "returned"));
    if (naive.threw) return;
    for (int which = 0; which < 2; ++which) {
        const std::vector<double>& got = which == 0 ? eigen.q : eigen.k;
        const std::vector<double>& want = which == 0 ? naive.q : naive.k;
        for (size_t i = 0; i < want.size(); ++i) {
            bool agree;
            if (std::isnan(want[i])) agree = std::isnan(got[i]);
            else if (std::isinf(want[i])) agree = got[i] == want[i];
            else agree = std::fabs(got[i] - want[i]) <= 2 * storage_roundoff(dtype) * std::fabs(want[i]) +
                                                            4e-6 * std::max({1.0, std::fabs(want[i]), attention});
            if (!agree)
                failure(call, std::string("cpu-eigen ") + (which == 0 ? "q" : "k") + "[" + std::to_string(i) +
                                  "] = " + std::to_string(got[i]) + ", cpu-naive " + std::to_string(want[i]));
        }
    }
}

// Validation alone, for views that exist only as numbers.
void validate_only(const Call& call, const rope::RopeArgs& args) {
    // A valid non-empty call gets a frequency table of about 25 bytes per pair,
    // as it should (its tensors are larger still); past 2^22 pairs that is more
    // memory than a fuzzing process may take, so such configs are not tried.
    if (call.config.effective_rotary_dim() > (int64_t(1) << 23)) return;
    try {
        (void)rope::make_plan(call.config, args, rope::Device::host);
    } catch (const rope::Error&) {
        return;
    }
    // Accepted: every operand must be addressable with int64 element offsets,
    // as every backend computes them (Geometry::offset).
    for (int v = 0; v < 4; ++v)
        if (!byte_extent(call.views[size_t(v)]))
            failure(call, std::string("make_plan accepted ") + kRegionNames[v] +
                              ", whose element offsets do not fit in int64");
}

}  // namespace

// ---------------------------------------------------------------------------
// 5. The entry point libFuzzer calls with each input
// ---------------------------------------------------------------------------

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::unique_ptr<rope::Backend> naive = rope::make_backend("cpu-naive");
    static const std::unique_ptr<rope::Backend> eigen = rope::make_backend("cpu-eigen");

    FuzzedDataProvider in(data, size);
    Call call = decode_call(in);
    static const bool print = std::getenv("ROPE_FUZZ_PRINT") != nullptr;
    if (print) std::fprintf(stderr, "%s", describe(call).c_str());
    Arena arena = lay_out(call);
    rope::RopeArgs args{call.views[kQ], call.views[kK], call.views[kQOut], call.views[kKOut], call.positions,
                        call.direction, nullptr, call.has_cache ? call.cache : rope::CosSinCache{}};
    if (!arena.run || !fill(call, arena)) {
        validate_only(call, args);
        if (print) std::fprintf(stderr, "outcome: validated only\n");
        return 0;
    }
    const std::vector<uint8_t> start = arena.bytes;

    // The expected rotation, from the inputs as they are before either backend ran.
    const bool use_oracle = oracle_can_compute(call);
    std::vector<double> want_q, want_k;
    double tolerance = 0;
    bool oracle_ready = false;
    const Outcome from_naive = run_backend(*naive, call, arena, start, args);
    const bool empty = call.views[kQ].numel() == 0 && call.views[kK].numel() == 0;
    if (!from_naive.threw && use_oracle && !empty) {
        std::memcpy(arena.bytes.data(), start.data(), start.size());
        const rope::TensorView& q = call.views[kQ];
        const rope::TensorView& k = call.views[kK];
        // (An empty tensor has nothing to expect; the oracle would still size
        // its frequency table by head_dim, which may be huge.)
        auto expected = [&](const rope::TensorView& view) {
            if (view.numel() == 0) return std::vector<double>{};
            if (call.has_cache) return oracle::rotate(call.config, view, call.positions, call.direction, call.cache);
            return oracle::rotate(call.config, view, call.positions, call.direction);
        };
        want_q = expected(q);
        want_k = expected(k);
        tolerance = oracle_tolerance(call, largest_position(call, q.geometry().seq), q.dtype);
        oracle_ready = true;
        check_against_oracle(call, from_naive, "cpu-naive", want_q, want_k, tolerance);
    }
    const Outcome from_eigen = run_backend(*eigen, call, arena, start, args);
    check_agreement(call, from_eigen, from_naive, call.views[kQ].dtype,
                    from_naive.threw || empty ? 1.0 : attention_factor(call, args));
    if (oracle_ready) check_against_oracle(call, from_eigen, "cpu-eigen", want_q, want_k, tolerance);
    if (print)
        std::fprintf(stderr, "outcome: %s\n",
                     from_naive.threw ? from_naive.message.c_str()
                     : empty          ? "empty: nothing written"
                     : oracle_ready   ? "rotated, equal to the oracle and across backends"
                                      : "rotated, equal across backends");
    return 0;
}

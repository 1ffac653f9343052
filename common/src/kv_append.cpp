// make_kv_append_plan: every check a RoPE + KV append call must pass, in one
// place for all backends, and rope::append_kv. The rotation of q and k is
// checked by make_plan; this file checks v, the slot mapping and the caches.
//
// Each failure names the parameter as the user wrote it (k_cache.stride_slot,
// slot_mapping.slots[3], ...) and the value it had; nothing is written before
// every check has passed.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rope/backend.hpp"
#include "rope/detail/kv_append_plan.hpp"
#include "rope/detail/plan.hpp"
#include "rope/error.hpp"

namespace rope {
namespace {

// Offsets of two caches compared in bytes: sums of 64-bit products need more room.
__extension__ typedef __int128 Wide;

// Byte range [begin, end) that some memory touches (empty when begin == end).
struct Extent {
    uintptr_t begin = 0;
    uintptr_t end = 0;
};

bool overlaps(const Extent& x, const Extent& y) {
    return x.begin < x.end && y.begin < y.end && x.begin < y.end && y.begin < x.end;
}

Extent extent_of(const TensorView& view) {
    if (view.numel() == 0) return {};
    int64_t last = 0;
    for (int axis = 0; axis < 4; ++axis) last += (view.shape[axis] - 1) * view.strides[axis];
    const auto begin = reinterpret_cast<uintptr_t>(view.data);
    return {begin, begin + static_cast<uintptr_t>((last + 1) * dtype_size(view.dtype))};
}

Extent extent_of(const void* data, int64_t bytes) {
    const auto begin = reinterpret_cast<uintptr_t>(data);
    return data == nullptr ? Extent{} : Extent{begin, begin + static_cast<uintptr_t>(bytes)};
}

int64_t element_size(CacheDType dtype, DType model) { return dtype == CacheDType::model ? dtype_size(model) : 1; }

// One axis of a set of cache rows: x in [0, count), contributing coefficient * x bytes;
// shift is the x of "the same row" when two rows of one cache are compared.
struct Term {
    Wide coefficient = 0;
    Wide count = 1;  // Wide: the difference of two indices of a 2^62-page cache spans 2^63.
    Wide shift = 0;
};

Wide magnitude(Wide x) { return x < 0 ? -x : x; }

// Whether some choice of x_i in [0, count_i) puts origin + sum(coefficient_i * x_i)
// strictly between low and high (with exclude_same, some x_i must differ from its
// shift: two rows of one cache compared, "the same row" is no collision). Exact: the
// terms are taken largest coefficient first, and each x_i only over the values that the
// remaining terms could still bring into the window, which for a layout whose axes nest
// (every real cache) is two or three values per axis. The budget bounds the work on
// pathological strides: search() returns -1 (undecided) when it is spent.
struct WindowSearch {
    std::vector<Term> terms;
    Wide low = 0, high = 0;
    bool exclude_same = false;
    int64_t budget = 1 << 16;
    std::vector<Wide> rest_low, rest_high;  // Least and most the terms after i can add.

    int run(Wide origin) {
        std::stable_sort(terms.begin(), terms.end(),
                         [](const Term& a, const Term& b) { return magnitude(a.coefficient) > magnitude(b.coefficient); });
        const size_t n = terms.size();
        rest_low.assign(n + 1, 0);
        rest_high.assign(n + 1, 0);
        for (size_t i = n; i-- > 0;) {
            const Wide reach = terms[i].coefficient * (terms[i].count - 1);
            rest_low[i] = rest_low[i + 1] + std::min<Wide>(reach, 0);
            rest_high[i] = rest_high[i + 1] + std::max<Wide>(reach, 0);
        }
        return search(0, origin, false);
    }

    static Wide floor_div(Wide a, Wide b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

    int search(size_t i, Wide value, bool moved) {
        if (--budget < 0) return -1;
        if (i == terms.size()) return value > low && value < high && (!exclude_same || moved) ? 1 : 0;
        const Term& term = terms[i];
        if (term.coefficient == 0) {  // Every x gives the same value: "the same" x, and one other if there is one.
            int found = search(i + 1, value, moved);
            if (found == 0 && exclude_same && term.count > 1) found = search(i + 1, value, true);
            return found;
        }
        // value + c*x + rest in (low, high), rest in [rest_low, rest_high] of the terms after i: c*x in (a, b).
        const Wide a = low - value - rest_high[i + 1], b = high - value - rest_low[i + 1], c = term.coefficient;
        const Wide x_low = c > 0 ? floor_div(a, c) + 1 : floor_div(-b, -c) + 1;
        const Wide x_high = c > 0 ? -floor_div(-b, c) - 1 : -floor_div(a, -c) - 1;
        const Wide first = std::max<Wide>(x_low, 0);
        const Wide last = std::min<Wide>(x_high, term.count - 1);
        for (Wide x = first; x <= last; ++x) {
            const int found = search(i + 1, value + c * x, moved || x != term.shift);
            if (found != 0) return found;
        }
        return 0;
    }
};

// The three row axes of a cache in bytes: (page, slot in page, head).
std::array<Term, 3> row_terms(const PagedCache& cache, int64_t element) {
    return {Term{Wide(cache.stride_page) * element, cache.pages, 0},
            Term{Wide(cache.stride_slot) * element, cache.page_size, 0},
            Term{Wide(cache.stride_head) * element, cache.heads, 0}};
}

// Checks one cache on its own: sizes, strides, pointer, device, dtype, scales.
Extent cache_extent(const PagedCache& cache, DType model) {
    const int64_t last = (cache.pages - 1) * cache.stride_page + (cache.page_size - 1) * cache.stride_slot +
                         (cache.heads - 1) * cache.stride_head + cache.head_dim;
    return extent_of(cache.data, last * element_size(cache.dtype, model));
}

// Whether a row of the k cache and a row of the v cache share a byte, decided exactly
// (not from their byte ranges, which interleave in a packed [K|V] buffer or an MLA cache).
// Returns 1 when they do, 0 when they do not, -1 when the search gave up (pathological strides).
int caches_collide(const PagedCache& k_cache, const PagedCache& v_cache, DType model) {
    const int64_t k_element = element_size(k_cache.dtype, model), v_element = element_size(v_cache.dtype, model);
    if (!overlaps(cache_extent(k_cache, model), cache_extent(v_cache, model))) return 0;
    // e = (v row start) - (k row start) = origin + sum(v terms) - sum(k terms); the rows share a
    // byte when -v_row_bytes < e < k_row_bytes. Equal strides of one axis become one term, the
    // difference of the two indices, so a nesting layout keeps the search small.
    WindowSearch search;
    Wide origin = Wide(reinterpret_cast<uintptr_t>(v_cache.data)) - Wide(reinterpret_cast<uintptr_t>(k_cache.data));
    const std::array<Term, 3> k_terms = row_terms(k_cache, k_element), v_terms = row_terms(v_cache, v_element);
    for (int axis = 0; axis < 3; ++axis) {
        if (k_terms[axis].coefficient == v_terms[axis].coefficient) {
            // x_v - x_k in [-(k count - 1), v count - 1]: x in [0, k + v - 1) shifted by k count - 1.
            search.terms.push_back({v_terms[axis].coefficient, k_terms[axis].count + v_terms[axis].count - 1, 0});
            origin -= v_terms[axis].coefficient * (k_terms[axis].count - 1);
        } else {
            search.terms.push_back(v_terms[axis]);
            search.terms.push_back({-k_terms[axis].coefficient, k_terms[axis].count, 0});
        }
    }
    search.low = -Wide(v_cache.head_dim) * v_element;
    search.high = Wide(k_cache.head_dim) * k_element;
    return search.run(origin);
}

// The dequantisation scales of an FP8 target (a cache, or q's FP8 output): one or one per head,
// float32-aligned, finite and > 0 where rope can read them (host memory).
void check_scales(std::string_view name, std::string_view what, CacheDType dtype, const float* scale, int64_t count,
                  int64_t heads, Device device) {
    const auto field = [&](std::string_view member) { return std::string(name) + "." + std::string(member); };
    if (scale == nullptr)
        fail(field("scale"), "null",
             std::string("an ") + cache_dtype_name(dtype) + " " + std::string(what) + " needs its dequantisation scale(s)");
    if (count != 1 && count != heads)
        fail(field("scale_count"), count, "must be 1 (per tensor) or heads = " + std::to_string(heads) + " (per head)");
    if (reinterpret_cast<uintptr_t>(scale) % 4 != 0)
        fail(field("scale"), static_cast<const void*>(scale), "must be aligned to 4 bytes (float32)");
    if (device != Device::host) return;  // Device scales cannot be read without a copy.
    for (int64_t i = 0; i < count; ++i)
        if (!std::isfinite(scale[i]) || scale[i] <= 0.0f)
            fail(field("scale[" + std::to_string(i) + "]"), scale[i], "must be finite and > 0");
}

// The bytes q's FP8 output spans (checked sizes and strides).
Extent fp8_output_extent(const Fp8Output& out) {
    if (out.data == nullptr || out.tokens == 0 || out.heads == 0 || out.head_dim == 0) return {};
    return extent_of(out.data, (out.tokens - 1) * out.stride_token + (out.heads - 1) * out.stride_head + out.head_dim);
}

// q's FP8 output on its own: device, format, q's sizes, strides, 64-bit offsets, rows apart, scales.
void check_fp8_output(const Fp8Output& out, const Geometry& q, int64_t tokens, Device device) {
    const auto field = [](std::string_view member) { return "q_out_fp8." + std::string(member); };
    if (out.device != device)
        fail(field("device"), device_name(out.device), "this backend runs on " + std::string(device_name(device)));
    if (out.dtype != CacheDType::e4m3fn && out.dtype != CacheDType::e5m2)
        fail(field("dtype"), out.dtype == CacheDType::model ? std::string("model") : std::to_string(int(out.dtype)),
             "must be CacheDType::e4m3fn or e5m2 (q in the model's dtype goes to q_out)");
    if (out.tokens != tokens) fail(field("tokens"), out.tokens, "must equal q's tokens = " + std::to_string(tokens));
    if (out.heads != q.heads) fail(field("heads"), out.heads, "must equal q heads = " + std::to_string(q.heads));
    if (out.head_dim != q.head_dim)
        fail(field("head_dim"), out.head_dim, "must equal q head_dim = " + std::to_string(q.head_dim));
    if (out.stride_token < 0) fail(field("stride_token"), out.stride_token, "strides must be >= 0");
    if (out.stride_head < 0) fail(field("stride_head"), out.stride_head, "strides must be >= 0");
    int64_t last = 0, reach = 0;
    if (__builtin_mul_overflow(out.tokens - 1, out.stride_token, &last) ||
        __builtin_mul_overflow(out.heads - 1 < 0 ? 0 : out.heads - 1, out.stride_head, &reach) ||
        __builtin_add_overflow(last, reach, &last) || __builtin_add_overflow(last, out.head_dim, &last))
        fail(field("stride_token"), out.stride_token,
             "with stride_head " + std::to_string(out.stride_head) + ": q_out_fp8's offsets overflow 64 bits");
    // Two (token, head) rows must not share a byte: one would overwrite the other.
    WindowSearch self;
    Wide origin = 0;
    for (const Term& term : {Term{Wide(out.stride_token), out.tokens, 0}, Term{Wide(out.stride_head), out.heads, 0}}) {
        self.terms.push_back({term.coefficient, 2 * term.count - 1, term.count - 1});
        origin -= term.coefficient * (term.count - 1);
    }
    self.low = -Wide(out.head_dim);
    self.high = Wide(out.head_dim);
    self.exclude_same = true;
    const int collide = out.head_dim > 0 && out.heads > 0 ? self.run(origin) : 0;
    if (collide != 0)
        fail(field("strides"), "[" + std::to_string(out.stride_token) + ", " + std::to_string(out.stride_head) + "]",
             std::string(collide > 0 ? "make two (token, head) rows share memory"
                                     : "cannot be shown to keep the (token, head) rows apart") +
                 " (tokens " + std::to_string(out.tokens) + ", heads " + std::to_string(out.heads) + ", head_dim " +
                 std::to_string(out.head_dim) + ")");
    check_scales("q_out_fp8", "output", out.dtype, out.scale, out.scale_count, out.heads, device);
}

void check_feature_stride(std::string_view name, const TensorView& view) {
    const Geometry g = view.geometry();
    if (view.numel() != 0 && g.head_dim > 1 && g.stride_dim != 1)
        fail(std::string(name) + " feature stride", g.stride_dim,
             "must be 1: the head_dim axis of q, k, v, q_out and k_out is contiguous in this call");
}

}  // namespace

void detail::check_cache(std::string_view name, const PagedCache& cache, const Geometry& tensor, std::string_view tensor_name,
                 DType model, Device device) {
    const auto field = [&](std::string_view what) { return std::string(name) + "." + std::string(what); };
    if (cache.device != device)
        fail(field("device"), device_name(cache.device), "this backend runs on " + std::string(device_name(device)));
    if (cache.dtype != CacheDType::model && cache.dtype != CacheDType::e4m3fn && cache.dtype != CacheDType::e5m2)
        fail(field("dtype"), int(cache.dtype), "must be CacheDType::model, e4m3fn or e5m2");
    if (cache.pages < 1) fail(field("pages"), cache.pages, "must be >= 1");
    if (cache.page_size < 1) fail(field("page_size"), cache.page_size, "must be >= 1");
    if (cache.heads != tensor.heads)
        fail(field("heads"), cache.heads,
             "must equal " + std::string(tensor_name) + " heads = " + std::to_string(tensor.heads));
    if (cache.head_dim != tensor.head_dim)
        fail(field("head_dim"), cache.head_dim,
             "must equal " + std::string(tensor_name) + " head_dim = " + std::to_string(tensor.head_dim));
    const std::array<std::pair<const char*, int64_t>, 3> strides{
        {{"stride_page", cache.stride_page}, {"stride_slot", cache.stride_slot}, {"stride_head", cache.stride_head}}};
    for (const auto& [what, stride] : strides)
        if (stride < 0) fail(field(what), stride, "strides must be >= 0");
    const int64_t element = element_size(cache.dtype, model);
    // The last element's offset, and the size in bytes, must fit in int64 (the kernels' offsets).
    int64_t slots = 0, last = 0, reach = 0, bytes = 0;
    const bool overflow = __builtin_mul_overflow(cache.pages, cache.page_size, &slots) ||
                          __builtin_mul_overflow(cache.pages - 1, cache.stride_page, &last) ||
                          __builtin_mul_overflow(cache.page_size - 1, cache.stride_slot, &reach) ||
                          __builtin_add_overflow(last, reach, &last) ||
                          __builtin_mul_overflow(cache.heads - 1 < 0 ? 0 : cache.heads - 1, cache.stride_head, &reach) ||
                          __builtin_add_overflow(last, reach, &last) ||
                          __builtin_add_overflow(last, cache.head_dim, &last) ||
                          __builtin_mul_overflow(last, element, &bytes);
    if (overflow)
        fail(field("pages"), cache.pages,
             "with page_size " + std::to_string(cache.page_size) + " and strides [" +
                 std::to_string(cache.stride_page) + ", " + std::to_string(cache.stride_slot) + ", " +
                 std::to_string(cache.stride_head) + "]: the cache's slots or offsets overflow 64 bits");
    if (cache.data == nullptr) fail(field("data"), "null", "a cache needs memory");
    if (reinterpret_cast<uintptr_t>(cache.data) % uintptr_t(element) != 0)
        fail(field("data"), cache.data, "must be aligned to " + std::to_string(element) + " bytes (its element size)");
    // Two (page, slot, head) rows of the cache must not share a byte: a write would land in another token's row.
    WindowSearch self;
    Wide origin = 0;
    for (const Term& term : row_terms(cache, element)) {
        // The difference of two rows' indices, x - shift for x in [0, 2 count - 1).
        self.terms.push_back({term.coefficient, 2 * term.count - 1, term.count - 1});
        origin -= term.coefficient * (term.count - 1);
    }
    const Wide row_bytes = Wide(cache.head_dim) * element;
    self.low = -row_bytes;
    self.high = row_bytes;
    self.exclude_same = true;
    const int collide = cache.head_dim > 0 ? self.run(origin) : 0;
    if (collide != 0)
        fail(field("strides"),
             "[" + std::to_string(cache.stride_page) + ", " + std::to_string(cache.stride_slot) + ", " +
                 std::to_string(cache.stride_head) + "]",
             std::string(collide > 0 ? "make two (page, slot, head) rows of " + std::string(name) + " share memory"
                                     : "cannot be shown to keep the rows of " + std::string(name) +
                                           " apart (they do not nest)") +
                 " (pages " + std::to_string(cache.pages) + ", page_size " + std::to_string(cache.page_size) +
                 ", heads " + std::to_string(cache.heads) + ", head_dim " + std::to_string(cache.head_dim) + ")");
    // Scales: FP8 only, one or one per head, finite and > 0 where rope can read them.
    if (cache.dtype == CacheDType::model) {
        if (cache.scale != nullptr || cache.scale_count != 0)
            fail(field("scale_count"), cache.scale_count,
                 "must be 0 with a null scale for a model-dtype cache (scales are for FP8 caches)");
        return;
    }
    check_scales(name, "cache", cache.dtype, cache.scale, cache.scale_count, cache.heads, device);
}


void detail::check_host_slots(const SlotMapping& slots, int64_t slot_limit) {
    if (slots.device != Device::host || slots.count <= 0) return;
    std::vector<std::pair<int64_t, int64_t>> written;  // (slot, token)
    for (int64_t t = 0; t < slots.count; ++t) {
        const int64_t slot = slots.slots[t];
        if (slot < 0) continue;  // Padding.
        if (slot >= slot_limit)
            fail("slot_mapping.slots[" + std::to_string(t) + "]", slot,
                 "must be < pages * page_size = " + std::to_string(slot_limit) + " (or < 0: padding)");
        written.push_back({slot, t});
    }
    std::sort(written.begin(), written.end());
    for (size_t i = 1; i < written.size(); ++i)
        if (written[i].first == written[i - 1].first)
            fail("slot_mapping.slots[" + std::to_string(written[i].second) + "]", written[i].first,
                 "is also the slot of token " + std::to_string(written[i - 1].second) +
                     " (each slot is written once per call)");
}

bool detail::cache_overlaps(const PagedCache& cache, DType model, const void* data, int64_t bytes) {
    return overlaps(cache_extent(cache, model), extent_of(data, bytes));
}

KvAppendPlan make_kv_append_plan(const RopeConfig& config, const KvAppendArgs& args, Device device) {
    RopeArgs rope_args{args.q, args.k, args.q_out, args.k_out, args.positions, Direction::forward, args.stream,
                       args.cos_sin_cache};
    KvAppendPlan plan;
    plan.rope = make_plan(config, rope_args, device);  // q, k, q_out, k_out, positions, table.
    detail::refuse_window_and_reordering(config, "append_kv");
    const Geometry q = args.q.geometry(), k = args.k.geometry(), v = args.v.geometry();
    const DType model = args.q.dtype;
    if (q.batch > 1)
        fail("q batch", q.batch, "must be 1: q, k and v are [tokens, heads, head_dim] (a thd view)");
    const int64_t tokens = q.batch == 0 ? 0 : q.seq;
    for (const auto& [name, view] : {std::pair<const char*, const TensorView*>{"q", &args.q},
                                     {"k", &args.k}, {"v", &args.v}, {"q_out", &args.q_out}, {"k_out", &args.k_out}})
        check_feature_stride(name, *view);

    // v: k's tokens and heads, any head_dim, q's dtype, the backend's device.
    for (int axis = 0; axis < 4; ++axis) {
        if (args.v.shape[axis] < 0)
            fail("v.shape[" + std::to_string(axis) + "]", args.v.shape[axis], "sizes must be >= 0");
        if (args.v.strides[axis] < 0)
            fail("v.strides[" + std::to_string(axis) + "]", args.v.strides[axis], "strides must be >= 0");
    }
    if (args.v.layout == Layout::thd && args.v.shape[3] != 1)
        fail("v.shape[3]", args.v.shape[3], "must be 1 for a thd view ([total_tokens, heads, head_dim])");
    if (tokens > 0 && k.heads < 1)
        fail("k heads", k.heads, "must be >= 1: the keys this call appends to k_cache");
    if (tokens > 0) {
        if (v.batch != 1) fail("v batch", v.batch, "must be 1: v is [tokens, heads, head_dim]");
        if (v.seq != tokens) fail("v seq", v.seq, "must equal q's tokens = " + std::to_string(tokens));
        if (v.heads != k.heads) fail("v heads", v.heads, "must equal k heads = " + std::to_string(k.heads));
        if (v.head_dim < 1) fail("v head_dim", v.head_dim, "must be >= 1");
        int64_t last = 0, reach = 0, count = 0;
        for (int axis = 0; axis < 4; ++axis)
            if (__builtin_mul_overflow(args.v.shape[axis] - 1, args.v.strides[axis], &reach) ||
                __builtin_add_overflow(last, reach, &last) ||
                __builtin_mul_overflow(last + 1, dtype_size(args.v.dtype), &count))
                fail("v.shape", v.seq, "with its strides: v's offsets overflow 64 bits");
        if (args.v.data == nullptr) fail("v.data", "null", "a non-empty tensor needs memory");
        if (reinterpret_cast<uintptr_t>(args.v.data) % uintptr_t(dtype_size(args.v.dtype)) != 0)
            fail("v.data", args.v.data, "must be aligned to " + std::to_string(dtype_size(args.v.dtype)) + " bytes");
        if (args.v.device != device)
            fail("v.device", device_name(args.v.device), "this backend runs on " + std::string(device_name(device)));
        if (args.v.dtype != model)
            fail("v.dtype", dtype_name(args.v.dtype), "must equal q's dtype " + std::string(dtype_name(model)));
        check_feature_stride("v", args.v);
        for (const auto& [name, view] :
             {std::pair<const char*, const TensorView*>{"q_out", &args.q_out}, {"k_out", &args.k_out}})
            if (overlaps(extent_of(*view), extent_of(args.v)))
                fail(std::string(name) + ".data", view->data, "overlaps v (v is read while outputs are written)");
    }

    // The slot mapping: at most one entry per token, on the backend's device.
    const SlotMapping& slots = args.slot_mapping;
    if (slots.count < 0) fail("slot_mapping.count", slots.count, "must be >= 0");
    if (slots.count > tokens)
        fail("slot_mapping.count", slots.count, "must be <= the call's tokens = " + std::to_string(tokens));
    if (slots.count > 0 && slots.slots == nullptr) fail("slot_mapping.slots", "null", "count > 0 needs the slots");
    if (slots.count > 0 && slots.device != device)
        fail("slot_mapping.device", device_name(slots.device), "this backend runs on " + std::string(device_name(device)));
    if (tokens == 0) return plan;  // Nothing to rotate or write: a valid no-op.

    detail::check_cache("k_cache", args.k_cache, k, "k", model, device);
    detail::check_cache("v_cache", args.v_cache, v, "v", model, device);
    if (args.v_cache.pages != args.k_cache.pages)
        fail("v_cache.pages", args.v_cache.pages,
             "must equal k_cache.pages = " + std::to_string(args.k_cache.pages) + " (one slot names a row of each)");
    if (args.v_cache.page_size != args.k_cache.page_size)
        fail("v_cache.page_size", args.v_cache.page_size,
             "must equal k_cache.page_size = " + std::to_string(args.k_cache.page_size));
    const int collide = caches_collide(args.k_cache, args.v_cache, model);
    if (collide != 0)
        fail("v_cache.data", args.v_cache.data,
             collide > 0 ? "a row of v_cache shares memory with a row of k_cache"
                         : "v_cache and k_cache overlap in a way rope cannot show to be disjoint "
                           "(their strides do not nest)");
    const CosSinCache& cs = args.cos_sin_cache;
    const Extent table =
        extent_of(cs.data, cs.data == nullptr ? 0 : ((cs.rows - 1) * std::max(cs.row_stride, cs.cols) + cs.cols) * 4);
    // q's FP8 output replaces q_out, which then stays q (and is not written).
    const Fp8Output& q_fp8 = args.q_out_fp8;
    if (q_fp8.data == nullptr && (q_fp8.scale != nullptr || q_fp8.scale_count != 0))
        fail("q_out_fp8.data", "null", "with a scale set: an FP8 q output needs its memory (or no scale, for q_out)");
    if (q_fp8.data != nullptr) {
        check_fp8_output(q_fp8, q, tokens, device);
        if (args.q.numel() != 0 && (args.q_out.data != args.q.data || args.q_out.geometry().stride_head != q.stride_head ||
                                    args.q_out.geometry().stride_seq != q.stride_seq))
            fail("q_out.data", args.q_out.data,
                 "must be q itself when q_out_fp8 is given: rotated q goes to q_out_fp8 alone, and q is left as it was");
        const std::array<std::pair<const char*, Extent>, 9> read_or_written{{
            {"q", extent_of(args.q)},
            {"k", extent_of(args.k)},
            {"v", extent_of(args.v)},
            {"k_out", extent_of(args.k_out)},
            {"slot_mapping.slots", extent_of(slots.slots, slots.count * 8)},
            {"k_cache.scale", extent_of(args.k_cache.scale, args.k_cache.scale_count * 4)},
            {"v_cache.scale", extent_of(args.v_cache.scale, args.v_cache.scale_count * 4)},
            {"q_out_fp8.scale", extent_of(q_fp8.scale, q_fp8.scale_count * 4)},
            {"cos_sin_cache", table},
        }};
        for (const auto& [other, extent] : read_or_written)
            if (overlaps(fp8_output_extent(q_fp8), extent))
                fail("q_out_fp8.data", q_fp8.data,
                     "overlaps " + std::string(other) + " (q_out_fp8 is written while it is read or written)");
    }

    // The caches must not share memory with anything the call reads or writes elsewhere.
    const std::array<std::pair<const char*, Extent>, 11> others{{
        {"q", extent_of(args.q)},
        {"k", extent_of(args.k)},
        {"v", extent_of(args.v)},
        {"q_out", extent_of(args.q_out)},
        {"k_out", extent_of(args.k_out)},
        {"slot_mapping.slots", extent_of(slots.slots, slots.count * 8)},
        {"cos_sin_cache", table},
        {"k_cache.scale", extent_of(args.k_cache.scale, args.k_cache.scale_count * 4)},
        {"v_cache.scale", extent_of(args.v_cache.scale, args.v_cache.scale_count * 4)},
        {"q_out_fp8", fp8_output_extent(q_fp8)},
        {"q_out_fp8.scale", extent_of(q_fp8.scale, q_fp8.scale_count * 4)},
    }};
    for (const auto& [name, cache] : {std::pair<const char*, const PagedCache*>{"k_cache", &args.k_cache},
                                      {"v_cache", &args.v_cache}})
        for (const auto& [other, extent] : others)
            if (overlaps(cache_extent(*cache, model), extent))
                fail(std::string(name) + ".data", cache->data,
                     "overlaps " + std::string(other) + " (the cache is written while it is read or written)");

    int64_t slot_limit = 0;
    __builtin_mul_overflow(args.k_cache.pages, args.k_cache.page_size, &slot_limit);  // Checked by check_cache.
    detail::check_host_slots(slots, slot_limit);

    plan.v = args.v.data;
    plan.v_geometry = v;
    plan.slots = slots.slots;
    plan.slot_count = slots.count;
    plan.page_size = args.k_cache.page_size;
    plan.slot_limit = slot_limit;
    for (const auto& [target, cache] :
         {std::pair<CacheTarget*, const PagedCache*>{&plan.k_cache, &args.k_cache}, {&plan.v_cache, &args.v_cache}})
        *target = CacheTarget{cache->data,        cache->dtype,       cache->heads,
                              cache->head_dim,    cache->stride_page, cache->stride_slot,
                              cache->stride_head, cache->scale,       cache->scale_count > 1 ? 1 : 0};
    if (q_fp8.data != nullptr)
        plan.q_fp8 = CacheTarget{q_fp8.data,        q_fp8.dtype, q_fp8.heads,           q_fp8.head_dim, q_fp8.stride_token,
                                 0,                 q_fp8.stride_head, q_fp8.scale, q_fp8.scale_count > 1 ? 1 : 0};
    return plan;
}

void Backend::run_kv_append(const KvAppendPlan&) {
    fail("backend", name(), "does not implement rope::append_kv");
}

void append_kv(Backend& backend, const RopeConfig& config, const KvAppendArgs& args) {
    const KvAppendPlan plan = make_kv_append_plan(config, args, backend.device());
    const BackendLimits limits = backend.limits();
    if (plan.rope.rotary_dim > limits.max_rotary_dim)
        fail("rotary_dim", plan.rope.rotary_dim,
             backend.name() + " accepts rotary_dim <= " + std::to_string(limits.max_rotary_dim));
    if (plan.empty()) return;
    backend.run_kv_append(plan);
}

}  // namespace rope

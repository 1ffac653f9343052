// RoPE + KV append (rope::append_kv) on every backend, against the float64
// oracle (oracle::append_kv). Every call starts from fresh random inputs,
// poisoned outputs and a poisoned cache; after it, q_out and k_out (every token,
// padding included) must match the oracle, each written cache element must hold
// the oracle's value (2-byte dtypes: within one storage ulp of it, plus the
// float32 pipeline's bound), and every other byte of the cache, and of the
// inputs of an out-of-place call, must be as it was. With an FP8 q output, its
// codes (every token) must be the reference's quantisation of the oracle's q,
// q itself unchanged, and the output's gaps untouched. The CUDA backends run on
// device copies of everything and report Skipped without a GPU.
//
// One test per bug of the serving engines' list (docs/api.md, "RoPE + KV
// append"): k written back, padding rotated but not cached, the angle from the
// positions and never from the slot, permuted and strided pages, 64-bit offsets
// (a sparse 8 GiB mapping), positions past the cos/sin table, saturating FP8.
#include <doctest/doctest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "backend_tags.hpp"
#include "cuda_helpers.hpp"
#include "oracle.hpp"
#include "rope/backend.hpp"
#include "rope/buffer.hpp"
#include "rope/detail/kv_append_plan.hpp"
#include "rope/error.hpp"
#include "rope/kv_append.hpp"
#include "fp8_reference.hpp"
#include "support.hpp"

using testing::HostTensor;

namespace {

enum class CacheLayout { nhd, hnd, packed_kv, strided_pages, mla };

const char* layout_label(CacheLayout layout) {
    switch (layout) {
        case CacheLayout::nhd: return "nhd";
        case CacheLayout::hnd: return "hnd";
        case CacheLayout::packed_kv: return "packed [K|V]";
        case CacheLayout::strided_pages: return "strided pages";
        case CacheLayout::mla: return "mla";
    }
    return "?";
}

// What one test call looks like.
struct Shape {
    int64_t tokens = 7, q_heads = 4, kv_heads = 2, head_dim = 32, v_dim = 32;
    int64_t pages = 6, page_size = 4;
    CacheLayout layout = CacheLayout::nhd;
    rope::DType dtype = rope::DType::f32;
    bool in_place = true;
    int64_t padding = 2;    // Tokens among the first slot_count with slot -1.
    int64_t tail = 1;       // Tokens past slot_count (padding too).
    int64_t q_pad = 0;      // Unused elements after each row of q, k, v (strided views).
    rope::CacheDType cache_dtype = rope::CacheDType::model;  // Of both caches (of k's alone with v_cache_dtype).
    std::optional<rope::CacheDType> v_cache_dtype;            // v's, where it differs (nhd, hnd, strided pages).
    float scale = 1.0f;     // FP8: the dequantisation scale of head 0 (head h: scale * (1 + 0.37 h) per head).
    bool per_head_scales = false;
    // An FP8 output of the rotated q (q_out is then q itself, and must stay unwritten).
    std::optional<rope::CacheDType> q_fp8;
    bool q_fp8_per_head = false;  // Scales of head h: scale * (0.9 + 0.29 h); else scale * 0.9 for all.
    int64_t q_fp8_gap = 0;  // Unused bytes before the output, after each head row and after each token
                            // (strides and a first byte aligned, or not, for 16-byte runs).
};

// A call on host memory. Both caches live in one byte buffer (they may interleave).
struct Setup {
    rope::RopeConfig config;
    Shape shape;
    HostTensor q, k, v, q_out, k_out;
    std::vector<int64_t> ids;  // [axes, tokens], or empty (offset).
    int64_t axes = 1;
    int64_t offset = 0;
    std::vector<int64_t> slots;  // [slot_count]
    std::vector<uint8_t> cache_bytes;
    rope::PagedCache k_cache, v_cache;  // Their data is rebased on cache_bytes by caches() (a copy moves it).
    int64_t k_offset = -1, v_offset = -1;  // Bytes into cache_bytes, or -1: data used as it is.
    std::vector<float> table;
    int64_t table_rows = 0;
    std::vector<float> k_scales, v_scales;  // FP8 caches: 1 or heads scales each.
    float scale_value = 1.0f;  // A scale for tests that need one.
    HostTensor spare;          // A replacement tensor for tests that need one.
    void* external = nullptr;  // Memory outside the setup (the large test's sparse cache), staged like the rest.
    size_t external_bytes = 0;
    std::vector<uint8_t> q_fp8_bytes;  // q's FP8 output and its gaps, poisoned, plus guard bytes after it.
    std::vector<float> q_scales;

    rope::Positions positions() const {
        if (ids.empty()) return rope::Positions::starting_at(offset);
        return rope::Positions::multi_axis(ids.data(), axes, 1, shape.tokens);
    }
    rope::CosSinCache cos_sin_cache() const {
        if (table.empty()) return {};
        return rope::CosSinCache::dense(table.data(), table_rows, config.effective_rotary_dim());
    }
    rope::PagedCache cache(bool keys) const {
        rope::PagedCache c = keys ? k_cache : v_cache;
        const int64_t offset = keys ? k_offset : v_offset;
        if (offset >= 0) c.data = const_cast<uint8_t*>(cache_bytes.data()) + offset;
        const std::vector<float>& scales = keys ? k_scales : v_scales;
        if (!scales.empty()) c.scale = scales.data(), c.scale_count = int64_t(scales.size());
        return c;
    }
    rope::Fp8Output q_fp8() const {
        if (!shape.q_fp8) return {};
        uint8_t* first = const_cast<uint8_t*>(q_fp8_bytes.data()) + shape.q_fp8_gap;
        rope::Fp8Output out = rope::Fp8Output::dense(first, rope::Device::host, shape.tokens, shape.q_heads,
                                                     shape.head_dim, *shape.q_fp8);
        out.stride_head = shape.head_dim + shape.q_fp8_gap;
        out.stride_token = shape.q_heads * out.stride_head + shape.q_fp8_gap;
        return out.with_scale(q_scales.data(), int64_t(q_scales.size()));
    }
    rope::KvAppendArgs args() const {
        rope::KvAppendArgs a = rope::KvAppendArgs::in_place(
            q.view, k.view, v.view, positions(),
            rope::SlotMapping{slots.empty() ? nullptr : slots.data(), int64_t(slots.size()), rope::Device::host},
            cache(true), cache(false));
        if (!shape.in_place) a.q_out = q_out.view, a.k_out = k_out.view;
        if (shape.q_fp8) a.q_out = q.view, a.q_out_fp8 = q_fp8();  // The FP8 output requires q_out = q.
        a.cos_sin_cache = cos_sin_cache();
        return a;
    }
    const HostTensor& q_result() const { return shape.in_place ? q : q_out; }
    const HostTensor& k_result() const { return shape.in_place ? k : k_out; }
};

// Distinct random slots over a random permutation of the pages (a page table that
// is not the identity), some of them -1.
std::vector<int64_t> random_slots(const Shape& shape, std::mt19937_64& rng) {
    std::vector<int64_t> pages(size_t(shape.pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::vector<int64_t> all;
    for (int64_t p : pages)
        for (int64_t s = 0; s < shape.page_size; ++s) all.push_back(p * shape.page_size + s);
    std::shuffle(all.begin(), all.end(), rng);
    const int64_t count = shape.tokens - shape.tail;
    std::vector<int64_t> slots(all.begin(), all.begin() + count);
    for (int64_t i = 0; i < shape.padding && i < count; ++i) slots[size_t((i * 5 + 1) % count)] = -1;
    return slots;
}

// Element size of a cache of type @p cache_dtype.
int64_t element_of(const Setup& s, rope::CacheDType cache_dtype) {
    return cache_dtype == rope::CacheDType::model ? rope::dtype_size(s.shape.dtype) : 1;
}

void build_caches(Setup& s) {
    const Shape& n = s.shape;
    const rope::CacheDType v_dtype = n.v_cache_dtype.value_or(n.cache_dtype);
    REQUIRE((v_dtype == n.cache_dtype || n.layout == CacheLayout::nhd || n.layout == CacheLayout::hnd ||
             n.layout == CacheLayout::strided_pages));
    const int64_t e = element_of(s, n.cache_dtype), v_e = element_of(s, v_dtype);
    const int64_t k_row = n.head_dim, v_row = n.v_dim;
    int64_t k_elements = 0, v_elements = 0;
    switch (n.layout) {
        case CacheLayout::nhd:
        case CacheLayout::hnd:
        case CacheLayout::strided_pages: {
            k_elements = n.pages * n.page_size * n.kv_heads * k_row + (n.layout == CacheLayout::strided_pages ? 13 * n.pages : 0);
            v_elements = n.pages * n.page_size * n.kv_heads * v_row + (n.layout == CacheLayout::strided_pages ? 13 * n.pages : 0);
            s.cache_bytes.assign(size_t(k_elements * e + v_elements * v_e + 64), 0);
            void* k_data = s.cache_bytes.data();
            void* v_data = s.cache_bytes.data() + k_elements * e + 32;
            if (n.layout == CacheLayout::hnd) {
                s.k_cache = rope::PagedCache::hnd(k_data, rope::Device::host, n.pages, n.page_size, n.kv_heads, k_row,
                                                  n.cache_dtype);
                s.v_cache = rope::PagedCache::hnd(v_data, rope::Device::host, n.pages, n.page_size, n.kv_heads, v_row,
                                                  v_dtype);
            } else {
                s.k_cache = rope::PagedCache::nhd(k_data, rope::Device::host, n.pages, n.page_size, n.kv_heads, k_row,
                                                  n.cache_dtype);
                s.v_cache = rope::PagedCache::nhd(v_data, rope::Device::host, n.pages, n.page_size, n.kv_heads, v_row,
                                                  v_dtype);
            }
            if (n.layout == CacheLayout::strided_pages) {  // 13 unused elements after every page.
                s.k_cache.stride_page += 13;
                s.v_cache.stride_page += 13;
            }
            break;
        }
        case CacheLayout::packed_kv: {  // [pages, page_size, heads, 2, head_dim]
            REQUIRE(n.v_dim == n.head_dim);
            s.cache_bytes.assign(size_t(n.pages * n.page_size * n.kv_heads * 2 * k_row * e), 0);
            s.k_cache = rope::PagedCache::nhd(s.cache_bytes.data(), rope::Device::host, n.pages, n.page_size,
                                              n.kv_heads, k_row, n.cache_dtype);
            s.k_cache.stride_head = 2 * k_row;
            s.k_cache.stride_slot = n.kv_heads * 2 * k_row;
            s.k_cache.stride_page = n.page_size * n.kv_heads * 2 * k_row;
            s.v_cache = s.k_cache;
            s.v_cache.data = s.cache_bytes.data() + k_row * e;
            break;
        }
        case CacheLayout::mla: {
            REQUIRE(n.kv_heads == 1);
            s.cache_bytes.assign(size_t(n.pages * n.page_size * (n.head_dim + n.v_dim) * e), 0);
            const rope::MlaCache mla = rope::mla_cache(s.cache_bytes.data(), n.dtype, rope::Device::host, n.pages,
                                                       n.page_size, n.v_dim, n.head_dim, n.cache_dtype);
            s.k_cache = mla.k_cache;
            s.v_cache = mla.v_cache;
            break;
        }
    }
    for (int64_t h = 0; h < (n.per_head_scales ? n.kv_heads : 1); ++h) {
        if (n.cache_dtype != rope::CacheDType::model) s.k_scales.push_back(n.scale * (1.0f + 0.37f * float(h)));
        if (v_dtype != rope::CacheDType::model) s.v_scales.push_back(n.scale * (1.7f + 0.37f * float(h)));
    }
    s.k_offset = static_cast<uint8_t*>(s.k_cache.data) - s.cache_bytes.data();
    s.v_offset = static_cast<uint8_t*>(s.v_cache.data) - s.cache_bytes.data();
    // Poison: every byte NaN-like (0xff is NaN in fp32, fp16, bf16 and both FP8 formats).
    std::fill(s.cache_bytes.begin(), s.cache_bytes.end(), uint8_t(0xff));
}

Setup make_setup(const rope::RopeConfig& config, const Shape& shape) {
    Setup s;
    s.config = config;
    s.shape = shape;
    auto& rng = testing::rng();
    s.q = testing::make_packed(shape.dtype, {shape.tokens, shape.q_heads, shape.head_dim}, shape.q_pad);
    s.k = testing::make_packed(shape.dtype, {shape.tokens, shape.kv_heads, shape.head_dim}, shape.q_pad);
    s.v = testing::make_packed(shape.dtype, {shape.tokens, shape.kv_heads, shape.v_dim}, shape.q_pad);
    s.q.fill_random();
    s.k.fill_random();
    s.v.fill_random();
    s.q_out = testing::make_packed(shape.dtype, {shape.tokens, shape.q_heads, shape.head_dim});
    s.k_out = testing::make_packed(shape.dtype, {shape.tokens, shape.kv_heads, shape.head_dim});
    s.q_out.poison();
    s.k_out.poison();
    s.offset = int64_t(rng() % 50);
    s.slots = random_slots(shape, rng);
    build_caches(s);
    if (shape.q_fp8) {
        const int64_t stride_token = shape.q_heads * (shape.head_dim + shape.q_fp8_gap) + shape.q_fp8_gap;
        // Poison (0xff: NaN in both formats), and 16 guard bytes past the last row.
        s.q_fp8_bytes.assign(size_t(shape.q_fp8_gap + shape.tokens * stride_token + 16), uint8_t(0xff));
        const int64_t count = shape.q_fp8_per_head ? std::max<int64_t>(shape.q_heads, 1) : 1;
        for (int64_t h = 0; h < count; ++h) s.q_scales.push_back(shape.scale * (0.9f + 0.29f * float(h)));
    }
    return s;
}

// Runs the call on the backend: directly on the host, or on device copies of every array (copied
// back, whether the call returns or throws). `adjust`, if given, changes the arguments last.
void run_append(rope::Backend& backend, Setup& s, const std::function<void(rope::KvAppendArgs&)>& adjust = {}) {
    if (backend.device() == rope::Device::host) {
        rope::KvAppendArgs a = s.args();
        if (adjust) adjust(a);
        rope::append_kv(backend, s.config, a);
        return;
    }
    // Each host array gets a device copy; pointers into it are moved by the same offset.
    struct Region {
        void* host;
        size_t bytes;
        rope::Buffer device;
    };
    std::vector<Region> regions;
    auto add = [&](void* host, size_t bytes) {
        if (host != nullptr && bytes > 0) {
            regions.push_back({host, bytes, rope::Buffer(rope::Device::cuda, bytes)});
            regions.back().device.copy_from_host(host);
        }
    };
    add(s.q.storage.data(), s.q.bytes());
    add(s.k.storage.data(), s.k.bytes());
    add(s.v.storage.data(), s.v.bytes());
    add(s.q_out.storage.data(), s.q_out.bytes());
    add(s.k_out.storage.data(), s.k_out.bytes());
    add(s.ids.data(), s.ids.size() * 8);
    add(s.slots.data(), s.slots.size() * 8);
    add(s.cache_bytes.data(), s.cache_bytes.size());
    add(s.external, s.external_bytes);
    add(s.table.data(), s.table.size() * 4);
    add(s.k_scales.data(), s.k_scales.size() * 4);
    add(s.v_scales.data(), s.v_scales.size() * 4);
    add(s.q_fp8_bytes.data(), s.q_fp8_bytes.size());
    add(s.q_scales.data(), s.q_scales.size() * 4);
    auto moved = [&](const void* pointer) -> void* {
        for (Region& r : regions) {
            const auto* base = static_cast<const uint8_t*>(r.host);
            const auto* p = static_cast<const uint8_t*>(pointer);
            if (p >= base && p < base + r.bytes) return static_cast<uint8_t*>(r.device.data()) + (p - base);
        }
        return const_cast<void*>(pointer);
    };
    rope::KvAppendArgs a = s.args();
    for (rope::TensorView* view : {&a.q, &a.k, &a.v, &a.q_out, &a.k_out}) {
        view->data = moved(view->data);
        view->device = rope::Device::cuda;
    }
    a.positions.ids = static_cast<const int64_t*>(moved(a.positions.ids));
    a.positions.device = rope::Device::cuda;
    a.positions.max_position = s.ids.empty() ? 0 : *std::max_element(s.ids.begin(), s.ids.end()) + 1;
    a.slot_mapping.slots = static_cast<const int64_t*>(moved(a.slot_mapping.slots));
    a.slot_mapping.device = rope::Device::cuda;
    for (rope::PagedCache* cache : {&a.k_cache, &a.v_cache}) {
        cache->data = moved(cache->data);
        cache->scale = static_cast<const float*>(moved(cache->scale));
        cache->device = rope::Device::cuda;
    }
    if (a.cos_sin_cache.data != nullptr) {
        a.cos_sin_cache.data = moved(a.cos_sin_cache.data);
        a.cos_sin_cache.device = rope::Device::cuda;
    }
    if (a.q_out_fp8.data != nullptr) {
        a.q_out_fp8.data = moved(a.q_out_fp8.data);
        a.q_out_fp8.scale = static_cast<const float*>(moved(a.q_out_fp8.scale));
        a.q_out_fp8.device = rope::Device::cuda;
    }
    if (adjust) adjust(a);
    try {
        rope::append_kv(backend, s.config, a);
    } catch (const rope::Error&) {
        for (Region& r : regions) r.device.copy_to_host(r.host);  // What a refused call left on the device.
        throw;
    }
    // copy_to_host synchronises (cudaMemcpy on the default stream).
    for (Region& r : regions) r.device.copy_to_host(r.host);
}

// Largest position of the call (for the float32 pipeline's tolerance).
int64_t largest_position(const Setup& s) {
    if (!s.ids.empty()) return *std::max_element(s.ids.begin(), s.ids.end());
    return s.offset + s.shape.tokens - 1;
}

// One storage ulp of |x| in the model dtype (fp32: none; its tolerance is the pipeline's).
double ulp_of(double x, rope::DType dtype) {
    if (dtype == rope::DType::f32) return 0;
    const int mantissa = dtype == rope::DType::bf16 ? 7 : 10;
    const int min_exponent = dtype == rope::DType::bf16 ? -126 : -14;
    int exponent = 0;
    std::frexp(std::fabs(x), &exponent);  // |x| in [2^(exponent-1), 2^exponent)
    return std::ldexp(1.0, std::max(exponent - 1, min_exponent) - mantissa);
}

// Reads element `index` of a model-dtype cache.
double cache_value(const Setup& s, const rope::PagedCache& cache, long index) {
    const rope::TensorView one{static_cast<uint8_t*>(cache.data) + index * element_of(s, cache.dtype), s.shape.dtype,
                               rope::Device::host, rope::Layout::bhsd, {1, 1, 1, 1}, {1, 1, 1, 1}};
    return oracle::read(one, 0, 0, 0, 0);
}

// CHECKs every value of `got` within one storage ulp of `want`, plus the float32 pipeline's bound.
void check_ulp(const std::vector<double>& got, const std::vector<double>& want, rope::DType dtype, double pipeline,
               const char* what) {
    REQUIRE(got.size() == want.size());
    long bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(got[i] - want[i]) <= ulp_of(want[i], dtype) + pipeline)) {
            if (bad++ == 0) first = i;
        }
    INFO(std::string(what) << ": " << bad << " of " << got.size() << " elements off by more than one ulp + " << pipeline
              << (bad ? " (first: element " + std::to_string(first) + ", got " + std::to_string(got[first]) +
                            ", want " + std::to_string(want[first]) + ")"
                      : std::string()));
    CHECK(bad == 0);
}

rope::Fp8Format fp8_format(rope::CacheDType dtype) {
    return dtype == rope::CacheDType::e4m3fn ? rope::Fp8Format::e4m3fn : rope::Fp8Format::e5m2;
}

// Whether `code` stands for value / scale: the reference code of the exact quotient or, where the
// float32 pipeline's error (slack) could carry the value across rounding boundaries, a code between
// the reference codes of the two ends of that error. A NaN code (the poison) never matches.
bool fp8_code_matches(uint8_t code, double value, double scale, double slack, rope::Fp8Format format) {
    if (code == testing::reference_fp8(value / scale, format)) return true;
    const double low = testing::reference_fp8_value(testing::reference_fp8((value - slack) / scale, format), format);
    const double high = testing::reference_fp8_value(testing::reference_fp8((value + slack) / scale, format), format);
    const double got = testing::reference_fp8_value(code, format);
    return got >= low && got <= high;
}

// q's FP8 output: every (token, head, feature) code (padding tokens too) against the oracle's
// rotation, quantised by the reference; every other byte of its buffer (the gaps, the guard
// bytes after it) as it was.
void check_q_fp8(const Setup& s, const Setup& before, const std::vector<double>& want_q, double pipeline) {
    const rope::Fp8Output out = s.q_fp8();
    const rope::Fp8Format format = fp8_format(out.dtype);
    const std::string format_name(rope::cache_dtype_name(out.dtype));
    CAPTURE(format_name);
    CAPTURE(s.shape.q_fp8_per_head);
    CAPTURE(s.shape.q_fp8_gap);
    REQUIRE(s.q_fp8_bytes.size() == before.q_fp8_bytes.size());
    std::vector<uint8_t> expected = before.q_fp8_bytes;
    const int64_t first = static_cast<const uint8_t*>(out.data) - s.q_fp8_bytes.data();
    long wrong = 0;
    for (int64_t t = 0; t < out.tokens; ++t)
        for (int64_t h = 0; h < out.heads; ++h)
            for (int64_t d = 0; d < out.head_dim; ++d) {
                const size_t at = size_t(first + t * out.stride_token + h * out.stride_head + d);
                expected[at] = s.q_fp8_bytes[at];
                const uint8_t code = s.q_fp8_bytes[at];
                const double value = want_q[size_t((h * out.tokens + t) * out.head_dim + d)];
                const double scale = s.q_scales[size_t(s.q_scales.size() == 1 ? 0 : h)];
                if (!fp8_code_matches(code, value, scale, pipeline + std::fabs(value) * 0x1p-22, format)) {
                    if (wrong == 0)
                        MESSAGE("first q FP8 mismatch: token " << t << " head " << h << " feature " << d << ": code "
                                                               << int(code) << ", reference "
                                                               << int(testing::reference_fp8(value / scale, format))
                                                               << " of " << value << " / " << scale);
                    ++wrong;
                }
            }
    INFO("q_out_fp8: " << wrong << " of " << out.tokens * out.heads * out.head_dim
                       << " codes differ from the reference");
    CHECK(wrong == 0);
    size_t changed = 0;
    for (size_t i = 0; i < expected.size(); ++i) changed += s.q_fp8_bytes[i] != expected[i];
    INFO("q_out_fp8 buffer bytes written outside its rows: " << changed);
    CHECK(changed == 0);
}

// Runs the setup on the backend and checks everything the header of this file lists.
void check_append(rope::Backend& backend, Setup s) {
    CAPTURE(backend.name());
    CAPTURE(std::string(layout_label(s.shape.layout)));
    CAPTURE(rope::dtype_name(s.shape.dtype));
    CAPTURE(testing::seed());
    std::vector<long> slots(s.slots.begin(), s.slots.end());
    const oracle::Appended want = oracle::append_kv(s.config, s.q.view, s.k.view, s.v.view, s.positions(), slots,
                                                    s.k_cache, s.v_cache, s.cos_sin_cache());
    const Setup before = s;  // HostTensor copies re-point; cache_bytes is copied too.
    run_append(backend, s);
    const double pipeline = testing::fp32_max_abs(largest_position(s));
    if (s.shape.q_fp8) {
        check_q_fp8(s, before, want.q, pipeline);
        // q stays as it was (q_out is q, and is not written), and the unused q_out tensor too.
        CHECK(s.q.storage == before.q.storage);
        CHECK(s.q_out.storage == before.q_out.storage);
    } else {
        check_ulp(s.q_result().values(), want.q, s.shape.dtype, pipeline, "q_out");
    }
    check_ulp(s.k_result().values(), want.k, s.shape.dtype, pipeline, "k_out (the live key)");
    // The cache: written elements hold the oracle's values; every other byte is untouched.
    std::vector<uint8_t> expected_untouched = before.cache_bytes;
    auto check_cache = [&](const rope::PagedCache& cache, const rope::PagedCache& cache_before,
                           const std::vector<oracle::CacheWrite>& writes, const char* what, bool keys) {
        const int64_t e = element_of(s, cache.dtype);
        std::vector<double> got, expected;
        const size_t offset = size_t(static_cast<uint8_t*>(cache.data) - s.cache_bytes.data());
        REQUIRE(offset == size_t(static_cast<uint8_t*>(cache_before.data) - before.cache_bytes.data()));
        long fp8_wrong = 0, fp8_not_own = 0;
        for (const oracle::CacheWrite& w : writes) {
            // Mark the written bytes as they are now, so the comparison below skips them.
            std::memcpy(expected_untouched.data() + offset + size_t(w.index * e),
                        s.cache_bytes.data() + offset + size_t(w.index * e), size_t(e));
            if (cache.dtype == rope::CacheDType::model) {
                got.push_back(cache_value(s, cache, w.index));
                expected.push_back(w.value);
                continue;
            }
            const rope::Fp8Format format =
                cache.dtype == rope::CacheDType::e4m3fn ? rope::Fp8Format::e4m3fn : rope::Fp8Format::e5m2;
            const uint8_t code = s.cache_bytes[offset + size_t(w.index)];
            const double scale = cache.scale[cache.scale_count == 1 ? 0 : w.head];
            // Against the oracle: the reference code of the exact value or, where the float32
            // pipeline's error (and the float32 division's) could carry the value across rounding
            // boundaries, a code between the reference codes of the two ends of that error.
            const double slack = (keys ? pipeline : 0.0) + std::fabs(w.value) * 0x1p-22;
            const uint8_t exact = testing::reference_fp8(w.value / scale, format);
            const double low = testing::reference_fp8_value(testing::reference_fp8((w.value - slack) / scale, format), format);
            const double high = testing::reference_fp8_value(testing::reference_fp8((w.value + slack) / scale, format), format);
            const double value = testing::reference_fp8_value(code, format);
            if (code != exact && !(value >= low && value <= high)) {
                if (fp8_wrong == 0)
                    MESSAGE("first FP8 mismatch: token " << w.token << " head " << w.head << " feature " << w.feature
                                                         << ": code " << int(code) << ", reference " << int(exact)
                                                         << " of " << w.value << " / " << scale);
                ++fp8_wrong;
            }
            if (keys && s.shape.dtype != rope::DType::f32) continue;
            // Bit-exact against the backend's own float32 value (k_out of an fp32 call holds it
            // unrounded; v is exact): quantize_fp8's definition, float32 division then one rounding.
            const float own = float(oracle::read(keys ? s.k_result().view : s.v.view, 0, w.head, w.token, w.feature));
            if (code != testing::reference_fp8(double(own / float(scale)), format)) ++fp8_not_own;
        }
        if (cache.dtype == rope::CacheDType::model) check_ulp(got, expected, s.shape.dtype, pipeline, what);
        INFO(std::string(what) << ": " << fp8_wrong << " of " << writes.size() << " FP8 codes differ from the reference");
        CHECK(fp8_wrong == 0);
        INFO(std::string(what) << ": " << fp8_not_own << " FP8 codes are not the reference's of the backend's own float32 value");
        CHECK(fp8_not_own == 0);
    };
    check_cache(s.cache(true), before.cache(true), want.k_cache, "k_cache rows", true);
    check_cache(s.cache(false), before.cache(false), want.v_cache, "v_cache rows", false);
    size_t changed = 0;
    for (size_t i = 0; i < s.cache_bytes.size(); ++i) changed += s.cache_bytes[i] != expected_untouched[i];
    INFO("cache bytes written outside the slots' rows: " << changed);
    CHECK(changed == 0);
    // Inputs: v always, q and k when out of place, byte for byte.
    CHECK(s.v.storage == before.v.storage);
    if (!s.shape.in_place) {
        CHECK(s.q.storage == before.q.storage);
        CHECK(s.k.storage == before.k.storage);
    }
}

rope::RopeConfig config_of(int64_t head_dim, int64_t rotary_dim = 0, rope::Style style = rope::Style::half_split) {
    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.rotary_dim = rotary_dim;
    config.style = style;
    return config;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("append_kv: cache layouts x dtypes x pairings x GQA, in and out of place", B, layouts) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (CacheLayout layout : {CacheLayout::nhd, CacheLayout::hnd, CacheLayout::packed_kv, CacheLayout::strided_pages})
        for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16, rope::DType::f16})
            for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved})
                for (bool in_place : {true, false}) {
                    Shape shape;
                    shape.layout = layout;
                    shape.dtype = dtype;
                    shape.in_place = in_place;
                    shape.q_pad = in_place ? 0 : 3;  // Strided q, k, v rows.
                    check_append(*backend, make_setup(config_of(32, 0, style), shape));
                }
}
TEST_CASE_TEMPLATE_APPLY(layouts, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("append_kv: MLA, k_pe [T, 1, 64] rotated into [pages, page_size, 512 + 64] after kv_c", B,
                          mla) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (rope::DType dtype : {rope::DType::bf16, rope::DType::f32}) {
        Shape shape;
        shape.layout = CacheLayout::mla;
        shape.dtype = dtype;
        shape.q_heads = 16;  // q_pe of every head rotated too.
        shape.kv_heads = 1;
        shape.head_dim = 64;
        shape.v_dim = 512;
        shape.page_size = 8;
        shape.tokens = 9;
        check_append(*backend, make_setup(config_of(64, 0, rope::Style::interleaved), shape));
    }
}
TEST_CASE_TEMPLATE_APPLY(mla, AllBackends);

// The angle forms beyond the default, at one head size: M-RoPE with distinct temporal, height and
// width ids (sections of the head's pairs), a caller's cos/sin table, precise angles at large
// positions with linear scaling. Each is a SUBCASE of the calling test.
void check_angle_forms(rope::Backend& backend, int64_t head_dim, const Shape& shape,
                       const std::vector<int64_t>& sections) {
    SUBCASE("M-RoPE with distinct temporal, height and width ids") {
        rope::RopeConfig config = config_of(head_dim);
        config.multi_axis.assignment = rope::AxisAssignment::mrope_contiguous;
        config.multi_axis.sections = sections;
        Setup s = make_setup(config, shape);
        s.axes = 3;
        for (int64_t a = 0; a < 3; ++a)
            for (int64_t t = 0; t < shape.tokens; ++t) s.ids.push_back(3 + t * (a + 1) + 7 * a);
        check_append(backend, s);
    }
    SUBCASE("a caller's cos/sin table") {
        rope::RopeConfig config = config_of(head_dim);
        Setup s = make_setup(config, shape);
        s.table_rows = 64;
        s.table = rope::make_cos_sin_cache(config, s.table_rows);
        check_append(backend, s);
    }
    SUBCASE("precise angles at large positions, linear scaling") {
        rope::RopeConfig config = config_of(head_dim);
        config.precise_angles = true;
        config.scaling.type = rope::ScalingType::linear;
        config.scaling.factor = 4.0;
        Setup s = make_setup(config, shape);
        s.offset = 100000;
        check_append(backend, s);
    }
}

TEST_CASE_TEMPLATE_DEFINE("append_kv: every angle form (partial rotary, M-RoPE ids, cos/sin table, precise, linear)",
                          B, angles) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    Shape shape;
    shape.dtype = rope::DType::bf16;
    SUBCASE("partial rotary") { check_append(*backend, make_setup(config_of(32, 16), shape)); }
    check_angle_forms(*backend, 32, shape, {4, 6, 6});
}
TEST_CASE_TEMPLATE_APPLY(angles, AllBackends);

// Head_dim 128 at decode: cuda-optimized's small calls, where the lanes of a warp that hold one
// token's rows split the cos/sin of their chunk and exchange them (cuda/optimized/prologue.cuh,
// PairShare). 1, 3 and 5 tokens of Llama's 32 + 8 heads, and of 6 + 1 (seven rows and one v row a
// token: warps straddle tokens and the v units); every angle form, both pairings, each dtype, FP8 too.
TEST_CASE_TEMPLATE_DEFINE("append_kv: head_dim 128 decode steps (warps of one token share cos/sin)", B, decode_128) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    auto shape_of = [](int64_t tokens, int64_t q_heads, int64_t kv_heads, rope::DType dtype) {
        Shape shape;
        shape.tokens = tokens;
        shape.q_heads = q_heads;
        shape.kv_heads = kv_heads;
        shape.head_dim = shape.v_dim = 128;
        shape.pages = 4;
        shape.page_size = 4;
        shape.padding = tokens > 1 ? 1 : 0;
        shape.tail = 0;
        shape.dtype = dtype;
        return shape;
    };
    SUBCASE("every dtype and pairing, 1, 3 and 5 tokens, positions from 4093") {
        for (int64_t tokens : {1, 3, 5})
            for (const std::pair<int64_t, int64_t>& heads : {std::pair<int64_t, int64_t>{32, 8}, {6, 1}})
                for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16, rope::DType::f16})
                    for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
                        // Named copies, not a structured binding: clang 16 with OpenMP refuses to capture
                        // one in CAPTURE's lambda.
                        const int64_t q_heads = heads.first, kv_heads = heads.second;
                        CAPTURE(tokens);
                        CAPTURE(q_heads);
                        CAPTURE(rope::dtype_name(dtype));
                        Setup s = make_setup(config_of(128, 0, style), shape_of(tokens, q_heads, kv_heads, dtype));
                        s.offset = 4093;
                        check_append(*backend, s);
                    }
    }
    const Shape shape = shape_of(5, 6, 1, rope::DType::bf16);
    SUBCASE("ids") {
        Setup s = make_setup(config_of(128), shape);
        for (int64_t t = 0; t < shape.tokens; ++t) s.ids.push_back(1000 + 37 * t);
        check_append(*backend, s);
    }
    check_angle_forms(*backend, 128, shape, {16, 24, 24});
    SUBCASE("e4m3fn and e5m2 caches, per-head scales") {
        for (rope::CacheDType format : {rope::CacheDType::e4m3fn, rope::CacheDType::e5m2})
            for (int64_t tokens : {1, 3}) {
                CAPTURE(rope::cache_dtype_name(format));
                Shape fp8 = shape_of(tokens, 32, 8, rope::DType::bf16);
                fp8.cache_dtype = format;
                fp8.scale = 0.0123f;
                fp8.per_head_scales = true;
                check_append(*backend, make_setup(config_of(128), fp8));
            }
    }
}
TEST_CASE_TEMPLATE_APPLY(decode_128, AllBackends);

// cuda-optimized gives a thread several rows of a token, loaded before the first is used (four into
// model-dtype caches, two into FP8 ones), once one thread per 16-byte chunk of every row would fill
// the GPU's thread slots (cuda/optimized/kv_append.cu, launch_append); the other tests' calls are
// smaller, and take the kernels for small calls. These
// calls take a quarter more tokens than that (Llama's 32 + 8 heads, head_dim 128, pages of 16 slots):
// past the threshold, and small enough for the compute-sanitizer tools to go through in seconds.
// The last also writes q's rotation to an e4m3fn output beside the e4m3fn caches, which the same
// kernel's threads store in place of q_out.
TEST_CASE_TEMPLATE_DEFINE("CUDA: append_kv calls that fill the GPU (several rows a thread), model-dtype and FP8 caches", B,
                          append_bandwidth) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    struct Case {
        rope::DType dtype;
        rope::Style style;
        rope::CacheDType cache;
        bool per_head;
        std::optional<rope::CacheDType> q_fp8;  // q's FP8 output, in the caches' format: the same kernel.
    };
    const Case cases[] = {{rope::DType::bf16, rope::Style::half_split, rope::CacheDType::model, false, {}},
                          {rope::DType::bf16, rope::Style::half_split, rope::CacheDType::e4m3fn, true, {}},
                          {rope::DType::bf16, rope::Style::interleaved, rope::CacheDType::e5m2, false, {}},
                          {rope::DType::f16, rope::Style::interleaved, rope::CacheDType::e4m3fn, false, {}},
                          {rope::DType::f32, rope::Style::half_split, rope::CacheDType::e4m3fn, true, {}},
                          {rope::DType::bf16, rope::Style::interleaved, rope::CacheDType::e4m3fn, true,
                           rope::CacheDType::e4m3fn}};
    for (const Case& c : cases) {
        const int64_t width = 16 / rope::dtype_size(c.dtype);  // Values per 16-byte vector.
        const int64_t threads_per_token = (32 + 8 + 8) * (128 / 2 / width);
        const int64_t slots = testing::cuda::thread_slots();
        Shape shape;
        shape.tokens = (5 * slots / 4 + threads_per_token - 1) / threads_per_token;
        shape.q_heads = 32;
        shape.kv_heads = 8;
        shape.head_dim = shape.v_dim = 128;
        shape.page_size = 16;
        shape.pages = shape.tokens / 16 + 8;
        shape.padding = 3;
        shape.tail = 2;
        shape.dtype = c.dtype;
        shape.in_place = false;
        shape.cache_dtype = c.cache;
        shape.scale = 0.0123f;
        shape.per_head_scales = c.per_head;
        shape.q_fp8 = c.q_fp8;
        shape.q_fp8_per_head = c.per_head;
        const bool q_fp8 = c.q_fp8.has_value();
        CAPTURE(shape.tokens);
        CAPTURE(rope::cache_dtype_name(c.cache));
        CAPTURE(c.per_head);
        CAPTURE(q_fp8);
        check_append(*backend, make_setup(config_of(128, 0, c.style), shape));
    }
}
TEST_CASE_TEMPLATE_APPLY(append_bandwidth, CudaBackends);

TEST_CASE_TEMPLATE_DEFINE("append_kv: FP8 caches (e4m3fn, e5m2), per-tensor and per-head scales, bit-exact", B, fp8) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (rope::CacheDType format : {rope::CacheDType::e4m3fn, rope::CacheDType::e5m2})
        for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16, rope::DType::f16})
            for (bool per_head : {false, true})
                for (CacheLayout layout : {CacheLayout::nhd, CacheLayout::packed_kv}) {
                    CAPTURE(rope::cache_dtype_name(format));
                    CAPTURE(per_head);
                    Shape shape;
                    shape.dtype = dtype;
                    shape.layout = layout;
                    shape.cache_dtype = format;
                    shape.scale = 0.0123f;  // Not a power of two: x / s rounds as its own quotient.
                    shape.per_head_scales = per_head;
                    shape.tokens = 12;
                    shape.tail = 2;
                    check_append(*backend, make_setup(config_of(32, 24), shape));
                }
    // k and v caches of different types (an FP8 k cache beside a model-dtype v cache, and the two
    // FP8 formats): the optimized CUDA backend sends these to its generic kernel.
    for (auto [k_dtype, v_dtype] : {std::pair{rope::CacheDType::e4m3fn, rope::CacheDType::model},
                                    std::pair{rope::CacheDType::model, rope::CacheDType::e5m2},
                                    std::pair{rope::CacheDType::e4m3fn, rope::CacheDType::e5m2}})
        for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16}) {
            const std::string names =
                std::string(rope::cache_dtype_name(k_dtype)) + " / " + std::string(rope::cache_dtype_name(v_dtype));
            CAPTURE(names);
            Shape shape;
            shape.dtype = dtype;
            shape.cache_dtype = k_dtype;
            shape.v_cache_dtype = v_dtype;
            shape.scale = 0.0123f;
            shape.per_head_scales = true;
            shape.tokens = 12;
            check_append(*backend, make_setup(config_of(32, 24), shape));
        }
    // MLA with an FP8 cache.
    Shape shape;
    shape.layout = CacheLayout::mla;
    shape.cache_dtype = rope::CacheDType::e4m3fn;
    shape.dtype = rope::DType::bf16;
    shape.kv_heads = 1;
    shape.head_dim = 64;
    shape.v_dim = 512;
    shape.scale = 0.02f;
    check_append(*backend, make_setup(config_of(64, 0, rope::Style::interleaved), shape));
}
TEST_CASE_TEMPLATE_APPLY(fp8, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("append_kv bug: FP8 saturates (scale != 1): overflow gives +-max, never inf or NaN", B,
                          fp8_saturation) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // Inputs up to 2 in magnitude (rotated: up to 2.83) over scales that put most of them past
    // the format's largest finite value (448 for e4m3fn, 57344 for e5m2).
    for (auto [format, scale, max_code] : {std::tuple{rope::CacheDType::e4m3fn, 1.0f / 1024, uint8_t(0x7e)},
                                           std::tuple{rope::CacheDType::e5m2, 1.0f / 65536 / 3, uint8_t(0x7b)}}) {
        // A named copy: lambdas (CAPTURE's) cannot capture a structured binding under clang's OpenMP.
        const std::string format_name(rope::cache_dtype_name(format));
        CAPTURE(format_name);
        Shape shape;
        shape.cache_dtype = format;
        shape.scale = scale;
        shape.padding = shape.tail = 0;
        Setup s = make_setup(config_of(32), shape);
        check_append(*backend, s);  // Codes equal to the saturating reference's.
        run_append(*backend, s);    // Once more, to count the codes.
        long saturated = 0, not_finite = 0;
        for (int64_t slot : s.slots)
            for (int64_t h = 0; h < shape.kv_heads; ++h)
                for (bool keys : {true, false}) {
                    const rope::PagedCache c = s.cache(keys);
                    const int64_t row = (slot / c.page_size) * c.stride_page + (slot % c.page_size) * c.stride_slot +
                                        h * c.stride_head;
                    for (int64_t d = 0; d < c.head_dim; ++d) {
                        const uint8_t code = static_cast<uint8_t*>(c.data)[row + d] & 0x7f;
                        saturated += code == max_code;
                        not_finite += format == rope::CacheDType::e4m3fn ? code == 0x7f : code >= 0x7c;
                    }
                }
        CHECK(saturated > 100);
        CHECK(not_finite == 0);
    }
}
TEST_CASE_TEMPLATE_APPLY(fp8_saturation, AllBackends);

// q's FP8 output beside every cache type: in the caches' own FP8 format (cuda-optimized's 16-byte
// kernel, where its runs are aligned), in the other one and beside model-dtype caches (its generic
// kernel). Gaps of 8 bytes keep every run aligned in a strided output; gaps of 5 do not.
TEST_CASE_TEMPLATE_DEFINE("append_kv: an FP8 q output (e4m3fn, e5m2), per-tensor and per-head scales, bit-exact", B,
                          q_fp8) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    SUBCASE("every format, cache type, dtype, pairing, scale and gap")
    for (rope::CacheDType q_format : {rope::CacheDType::e4m3fn, rope::CacheDType::e5m2})
        for (rope::CacheDType cache : {rope::CacheDType::model, rope::CacheDType::e4m3fn, rope::CacheDType::e5m2})
            for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16, rope::DType::f16})
                for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved})
                    for (int64_t rotary_dim : {0, 16})  // 16 of 32: pass-through features quantised too.
                        for (bool per_head : {false, true})
                            for (int64_t gap : {0, 8, 5}) {
                                const std::string names = std::string(rope::cache_dtype_name(q_format)) + " q, " +
                                                          rope::cache_dtype_name(cache) + " caches";
                                CAPTURE(names);
                                CAPTURE(rope::dtype_name(dtype));
                                CAPTURE(rotary_dim);
                                Shape shape;
                                shape.dtype = dtype;
                                shape.cache_dtype = cache;
                                shape.scale = 0.0123f;  // Not a power of two: x / s rounds as its own quotient.
                                shape.per_head_scales = per_head;
                                shape.q_fp8 = q_format;
                                shape.q_fp8_per_head = per_head;
                                shape.q_fp8_gap = gap;
                                shape.in_place = gap == 0;  // Out of place: k_out alone is separate.
                                shape.q_pad = gap == 5 ? 3 : 0;
                                shape.tokens = 9;  // Two of them padding, one past the slot list.
                                check_append(*backend, make_setup(config_of(32, rotary_dim, style), shape));
                            }
    // Partial rotary whose pairs are no whole 16-byte run, M-RoPE, a caller's table, MLA's q_pe, and
    // a call with no q heads at all (an output of no rows).
    Shape shape;
    shape.dtype = rope::DType::bf16;
    shape.cache_dtype = rope::CacheDType::e4m3fn;
    shape.scale = 0.02f;
    shape.q_fp8 = rope::CacheDType::e4m3fn;
    shape.q_fp8_per_head = true;
    SUBCASE("partial rotary 24 of 32") { check_append(*backend, make_setup(config_of(32, 24), shape)); }
    check_angle_forms(*backend, 32, shape, {4, 6, 6});
    SUBCASE("MLA q_pe, 16 heads of 64") {
        Shape mla = shape;
        mla.layout = CacheLayout::mla;
        mla.q_heads = 16;
        mla.kv_heads = 1;
        mla.head_dim = 64;
        mla.v_dim = 512;
        mla.page_size = 8;
        mla.tokens = 9;
        check_append(*backend, make_setup(config_of(64, 0, rope::Style::interleaved), mla));
    }
    SUBCASE("no q heads") {
        Shape none = shape;
        none.q_heads = 0;
        none.q_fp8_per_head = false;
        check_append(*backend, make_setup(config_of(32), none));
    }
}
TEST_CASE_TEMPLATE_APPLY(q_fp8, AllBackends);

// Head_dim 128, bf16, Llama's 32 + 8 heads: q in e4m3fn beside e4m3fn caches (and e5m2 beside
// e5m2) is what cuda-optimized's 16-byte kernel takes, at one token (its small calls), 16 and a few
// hundred (several rows a thread); e5m2 beside e4m3fn caches takes its generic kernel.
TEST_CASE_TEMPLATE_DEFINE("append_kv: head_dim 128 bf16 with an FP8 q output, 1, 16 and 300 tokens", B, q_fp8_128) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    const std::pair<rope::CacheDType, rope::CacheDType> formats[] = {
        {rope::CacheDType::e4m3fn, rope::CacheDType::e4m3fn},
        {rope::CacheDType::e5m2, rope::CacheDType::e5m2},
        {rope::CacheDType::e5m2, rope::CacheDType::e4m3fn}};
    for (const auto& format : formats)
        for (int64_t tokens : {1, 16, 300})
            for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
                const std::string names = std::string(rope::cache_dtype_name(format.first)) + " q, " +
                                          rope::cache_dtype_name(format.second) + " caches";
                CAPTURE(names);
                CAPTURE(tokens);
                Shape shape;
                shape.tokens = tokens;
                shape.q_heads = 32;
                shape.kv_heads = 8;
                shape.head_dim = shape.v_dim = 128;
                shape.page_size = 16;
                shape.pages = tokens / 16 + 3;
                shape.padding = tokens > 1 ? 2 : 0;
                shape.tail = tokens > 1 ? 1 : 0;
                shape.dtype = rope::DType::bf16;
                shape.cache_dtype = format.second;
                shape.scale = 0.0123f;
                shape.per_head_scales = tokens != 16;
                shape.q_fp8 = format.first;
                shape.q_fp8_per_head = tokens != 1;
                shape.q_fp8_gap = tokens == 16 ? 16 : 0;
                Setup s = make_setup(config_of(128, 0, style), shape);
                s.offset = 4093;
                check_append(*backend, s);
            }
}
TEST_CASE_TEMPLATE_APPLY(q_fp8_128, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("append_kv bug: FP8 q saturates (scale != 1): overflow gives +-max, never inf or NaN", B,
                          q_fp8_saturation) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // As the caches' test: inputs up to 2 in magnitude (rotated: up to 2.83) over scales that put
    // most of them past the format's largest finite value. The caches share q's format (one kernel)
    // or hold the model dtype (another).
    for (auto [format, scale, max_code] : {std::tuple{rope::CacheDType::e4m3fn, 1.0f / 1024, uint8_t(0x7e)},
                                           std::tuple{rope::CacheDType::e5m2, 1.0f / 65536 / 3, uint8_t(0x7b)}})
        for (bool model_caches : {false, true}) {
            // A named copy: lambdas (CAPTURE's) cannot capture a structured binding under clang's OpenMP.
            const std::string format_name(rope::cache_dtype_name(format));
            CAPTURE(format_name);
            CAPTURE(model_caches);
            Shape shape;
            shape.cache_dtype = model_caches ? rope::CacheDType::model : format;
            shape.scale = scale;
            shape.q_fp8 = format;
            shape.q_fp8_per_head = model_caches;
            Setup s = make_setup(config_of(32), shape);
            check_append(*backend, s);  // Codes equal to the saturating reference's.
            run_append(*backend, s);    // Once more, to count the codes.
            const rope::Fp8Output out = s.q_fp8();
            const bool e4m3fn = format == rope::CacheDType::e4m3fn;
            const uint8_t max_nan_or_inf = uint8_t(e4m3fn ? 0x7f : 0x7c);
            long positive = 0, negative = 0, not_finite = 0;
            for (int64_t t = 0; t < out.tokens; ++t)
                for (int64_t h = 0; h < out.heads; ++h)
                    for (int64_t d = 0; d < out.head_dim; ++d) {
                        const uint8_t code = static_cast<const uint8_t*>(
                            out.data)[t * out.stride_token + h * out.stride_head + d];
                        positive += code == max_code;
                        negative += code == uint8_t(max_code | 0x80);
                        not_finite += e4m3fn ? (code & 0x7f) == max_nan_or_inf : (code & 0x7f) >= max_nan_or_inf;
                    }
            CHECK(positive > 100);
            CHECK(negative > 100);
            CHECK(not_finite == 0);
        }
}
TEST_CASE_TEMPLATE_APPLY(q_fp8_saturation, AllBackends);

// The kernels dereference q_out_fp8's data and scale: host memory labelled cuda must be refused by
// name before any launch, not fault or write the host's bytes.
TEST_CASE_TEMPLATE_DEFINE("CUDA: append_kv refuses host memory as q_out_fp8's data or scale, and writes nothing", B,
                          q_fp8_host_memory) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    Shape shape;
    shape.cache_dtype = rope::CacheDType::e4m3fn;
    shape.scale = 0.05f;
    shape.q_fp8 = rope::CacheDType::e4m3fn;
    shape.q_fp8_per_head = true;
    for (bool data : {true, false}) {
        CAPTURE(data);
        Setup s = make_setup(config_of(32), shape);
        const Setup before = s;
        std::vector<uint8_t> host_bytes(s.q_fp8_bytes.size(), uint8_t(0xff));
        const std::vector<float> host_scales = s.q_scales;
        CHECK_THROWS_WITH_AS(run_append(*backend, s,
                                        [&](rope::KvAppendArgs& a) {
                                            if (data) a.q_out_fp8.data = host_bytes.data();
                                            else a.q_out_fp8.scale = host_scales.data();
                                        }),
                             doctest::Contains(data ? "q_out_fp8.data = " : "q_out_fp8.scale = "), rope::Error);
        CHECK(std::all_of(host_bytes.begin(), host_bytes.end(), [](uint8_t b) { return b == 0xff; }));
        CHECK(s.q_fp8_bytes == before.q_fp8_bytes);
        CHECK(s.cache_bytes == before.cache_bytes);
        CHECK(s.q.storage == before.q.storage);
        CHECK(s.k.storage == before.k.storage);
    }
}
TEST_CASE_TEMPLATE_APPLY(q_fp8_host_memory, CudaBackends);

TEST_CASE_TEMPLATE_DEFINE("append_kv bug: the rotated k is written back to the live k, not only to the cache", B,
                          written_back) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // check_append compares k_out (here k itself, in place) with the oracle's rotation for every
    // token: an implementation that wrote the rotated k only into the cache leaves k unrotated.
    for (bool in_place : {true, false}) {
        Shape shape;
        shape.in_place = in_place;
        shape.padding = 0;
        shape.tail = 0;
        shape.head_dim = shape.v_dim = 64;
        check_append(*backend, make_setup(config_of(64), shape));
    }
}
TEST_CASE_TEMPLATE_APPLY(written_back, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("append_kv bug: padding (slot -1, tokens past slot_count) rotated, never cached", B,
                          padding) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // check_append requires every token of q_out/k_out rotated (skipping padding leaves the
    // poison) and no cache byte outside the non-padding rows written.
    Shape shape;
    shape.tokens = 8;
    shape.padding = 3;
    shape.tail = 3;
    check_append(*backend, make_setup(config_of(32), shape));
    shape.tail = shape.tokens;  // slot_count 0: nothing cached at all.
    shape.padding = 0;
    check_append(*backend, make_setup(config_of(32), shape));
}
TEST_CASE_TEMPLATE_APPLY(padding, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("append_kv bug: the angle comes from the positions, never from the slot", B, angle_not_slot) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // After eviction or compaction a token's slot and position differ. Two calls with the same
    // positions and other slots must rotate alike, and match the oracle's rotation by position.
    Shape shape;
    shape.padding = 0;
    shape.tail = 0;
    Setup first = make_setup(config_of(32), shape);
    first.offset = 3;
    Setup second = first;
    std::reverse(second.slots.begin(), second.slots.end());
    for (int64_t& slot : second.slots) slot = (slot + 5) % (shape.pages * shape.page_size);
    check_append(*backend, first);
    check_append(*backend, second);
    run_append(*backend, first);
    run_append(*backend, second);
    CHECK(first.k.storage == second.k.storage);
    CHECK(first.q.storage == second.q.storage);
}
TEST_CASE_TEMPLATE_APPLY(angle_not_slot, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("append_kv bug: permuted page tables and strided pages", B, pages) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // random_slots spreads the tokens over a shuffled page table; strided_pages leaves 13 unused
    // elements after every page: a kernel that assumes contiguous pages writes the wrong rows.
    for (CacheLayout layout : {CacheLayout::strided_pages, CacheLayout::hnd}) {
        Shape shape;
        shape.layout = layout;
        shape.pages = 16;
        shape.page_size = 3;
        shape.tokens = 20;
        shape.dtype = rope::DType::bf16;
        check_append(*backend, make_setup(config_of(32), shape));
    }
}
TEST_CASE_TEMPLATE_APPLY(pages, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("append_kv bug: positions past the cos/sin table are refused", B, table_bounds) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    Shape shape;
    Setup s = make_setup(config_of(32), shape);
    s.table_rows = 16;
    s.table = rope::make_cos_sin_cache(s.config, s.table_rows);
    s.offset = 16 - shape.tokens + 1;  // The last token's position is the table's row count.
    const std::vector<uint8_t> cache = s.cache_bytes;
    if (backend->device() == rope::Device::host) {
        CHECK_THROWS_WITH_AS(rope::append_kv(*backend, s.config, s.args()),
                             doctest::Contains("must be < cos_sin_cache.rows = 16"), rope::Error);
        CHECK(s.cache_bytes == cache);
    } else {
        // Device positions cannot be checked: the kernels read no row outside the table (NaN).
        s.ids.resize(size_t(shape.tokens));
        std::iota(s.ids.begin(), s.ids.end(), s.offset);
        run_append(*backend, s);
        CHECK(std::isnan(s.k.values().back()));
    }
}
TEST_CASE_TEMPLATE_APPLY(table_bounds, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("append_kv: a slot past the cache is refused on the host, skipped on a device", B,
                          slot_bounds) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    Shape shape;
    shape.padding = shape.tail = 0;
    Setup s = make_setup(config_of(32), shape);
    s.slots[2] = shape.pages * shape.page_size + 5;  // Past the cache.
    if (backend->device() == rope::Device::host) {
        const std::vector<uint8_t> cache = s.cache_bytes;
        CHECK_THROWS_WITH_AS(rope::append_kv(*backend, s.config, s.args()),
                             doctest::Contains("slot_mapping.slots[2] = 29"), rope::Error);
        CHECK(s.cache_bytes == cache);
    } else {
        // Device slots cannot be read before the launch: the token is rotated, written nowhere
        // in the caches (the oracle's rule too), and every other token is cached.
        check_append(*backend, s);
    }
}
TEST_CASE_TEMPLATE_APPLY(slot_bounds, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("append_kv bug: 64-bit offsets, a slot past 2^31 elements of the cache", B, large_offsets) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // Two pages of one slot, the second starting 2^31 + 64 fp32 elements (8 GiB) in, in a
    // sparse host mapping (only the pages touched take memory; a CUDA backend gets a device
    // copy of all of it). Each page holds [k row | v row]: slot * stride_page in 32 bits
    // would wrap and write the wrong place.
    const int64_t stride_page = (int64_t(1) << 31) + 64;
    const size_t bytes = size_t(stride_page + 64) * 4;
    if (backend->device() == rope::Device::cuda && testing::cuda::free_device_memory() < bytes + (size_t(256) << 20)) {
        testing::report_skip("append_kv large offsets on " + backend->name(), "less than 8.3 GiB of device memory free");
        return;
    }
    void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        testing::report_skip("append_kv large offsets", "no sparse mapping of 8 GiB on this machine");
        return;
    }
    Shape shape;
    shape.tokens = 2;
    shape.kv_heads = shape.q_heads = 1;
    shape.pages = 2;
    shape.page_size = 1;
    shape.padding = shape.tail = 0;
    Setup s = make_setup(config_of(32), shape);
    auto* base = static_cast<float*>(map);
    s.k_offset = s.v_offset = -1;
    s.k_cache = rope::PagedCache::nhd(base, rope::Device::host, 2, 1, 1, 32);
    s.k_cache.stride_page = stride_page;
    s.v_cache = s.k_cache;
    s.v_cache.data = base + 32;
    s.slots = {1, 0};
    s.external = map;
    s.external_bytes = bytes;
    const std::vector<double> v = s.v.values();  // [1 head][2 tokens][32]
    run_append(*backend, s);
    const std::vector<double> k = s.k.values();  // Rotated in place.
    long wrong = 0;
    for (int64_t d = 0; d < 32; ++d) {
        wrong += double(base[stride_page + d]) != k[size_t(d)];        // Token 0 -> slot 1, past 2^31.
        wrong += double(base[stride_page + 32 + d]) != v[size_t(d)];
        wrong += double(base[d]) != k[size_t(32 + d)];                 // Token 1 -> slot 0.
        wrong += double(base[32 + d]) != v[size_t(32 + d)];
    }
    CHECK(wrong == 0);
    CHECK(base[64] == 0.0f);  // Nothing written after the first page's rows.
    munmap(map, bytes);
}
TEST_CASE_TEMPLATE_APPLY(large_offsets, AllBackends);

TEST_CASE("append_kv rejects bad input, naming the parameter, and writes nothing") {
    auto backend = rope::make_backend("cpu-naive");
    Shape shape;  // f32, 7 tokens, q 4 heads, k and v 2 heads of 32, 6 pages of 4 slots.
    shape.in_place = false;
    struct Bad {
        const char* parameter;
        std::function<void(Setup&, rope::KvAppendArgs&)> spoil;
    };
    const Bad cases[] = {
        {"slot_mapping.slots[0] = 24", [](Setup& s, rope::KvAppendArgs&) { s.slots[0] = 24; }},
        {"slot_mapping.slots[", [](Setup& s, rope::KvAppendArgs&) { s.slots[1] = s.slots[2] = 5; }},
        {"slot_mapping.count = 8", [](Setup&, rope::KvAppendArgs& a) { a.slot_mapping.count = 8; }},
        {"slot_mapping.count = -1", [](Setup&, rope::KvAppendArgs& a) { a.slot_mapping.count = -1; }},
        {"slot_mapping.slots = null", [](Setup&, rope::KvAppendArgs& a) { a.slot_mapping.slots = nullptr; }},
        {"slot_mapping.device = cuda", [](Setup&, rope::KvAppendArgs& a) { a.slot_mapping.device = rope::Device::cuda; }},
        {"k_cache.heads = 3", [](Setup&, rope::KvAppendArgs& a) { a.k_cache.heads = 3; }},
        {"v_cache.head_dim = 16", [](Setup&, rope::KvAppendArgs& a) { a.v_cache.head_dim = 16; }},
        {"k_cache.pages = 0", [](Setup&, rope::KvAppendArgs& a) { a.k_cache.pages = 0; }},
        {"k_cache.page_size = 0", [](Setup&, rope::KvAppendArgs& a) { a.k_cache.page_size = 0; }},
        {"v_cache.pages = 5", [](Setup&, rope::KvAppendArgs& a) { a.v_cache.pages = 5; }},
        {"v_cache.page_size = 2", [](Setup&, rope::KvAppendArgs& a) { a.v_cache.page_size = 2; }},
        {"k_cache.stride_slot = -1", [](Setup&, rope::KvAppendArgs& a) { a.k_cache.stride_slot = -1; }},
        {"k_cache.strides", [](Setup&, rope::KvAppendArgs& a) { a.k_cache.stride_head = 16; }},
        {"k_cache.strides", [](Setup&, rope::KvAppendArgs& a) { a.k_cache.stride_page = a.k_cache.stride_slot; }},
        {"k_cache.pages = 6", [](Setup&, rope::KvAppendArgs& a) { a.k_cache.stride_page = int64_t(1) << 62; }},
        {"k_cache.data = null", [](Setup&, rope::KvAppendArgs& a) { a.k_cache.data = nullptr; }},
        {"k_cache.device = cuda", [](Setup&, rope::KvAppendArgs& a) { a.k_cache.device = rope::Device::cuda; }},
        {"k_cache.data", [](Setup&, rope::KvAppendArgs& a) { a.k_cache.data = static_cast<char*>(a.k_cache.data) + 1; }},
        {"k_cache.scale_count = 1",
         [](Setup& s, rope::KvAppendArgs& a) { a.k_cache.scale = &s.scale_value, a.k_cache.scale_count = 1; }},
        {"v_cache.data", [](Setup&, rope::KvAppendArgs& a) { a.v_cache.data = static_cast<char*>(a.k_cache.data) + 64; }},
        {"v_cache.data", [](Setup&, rope::KvAppendArgs& a) { a.v_cache.data = a.k_cache.data; }},
        {"k_cache.data",
         [](Setup& s, rope::KvAppendArgs& a) { a.k_cache.data = s.q.storage.data(), a.k_cache.pages = a.v_cache.pages = 1; }},
        {"v heads = 1",
         [](Setup& s, rope::KvAppendArgs& a) { s.spare = testing::make_packed(s.shape.dtype, {7, 1, 32}), a.v = s.spare.view; }},
        {"v seq = 6",
         [](Setup& s, rope::KvAppendArgs& a) { s.spare = testing::make_packed(s.shape.dtype, {6, 2, 32}), a.v = s.spare.view; }},
        {"v.dtype = bf16",
         [](Setup& s, rope::KvAppendArgs& a) { s.spare = testing::make_packed(rope::DType::bf16, {7, 2, 32}), a.v = s.spare.view; }},
        {"v.device = cuda", [](Setup&, rope::KvAppendArgs& a) { a.v.device = rope::Device::cuda; }},
        {"v.data = null", [](Setup&, rope::KvAppendArgs& a) { a.v.data = nullptr; }},
        {"v feature stride = 2",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.spare = testing::make_packed(s.shape.dtype, {7, 2, 32}, 0, 2), a.v = s.spare.view;
         }},
        {"k_out.data", [](Setup&, rope::KvAppendArgs& a) { a.k_out = a.v; }},
        {"q batch = 7",
         [](Setup&, rope::KvAppendArgs& a) {
             for (rope::TensorView* view : {&a.q, &a.k, &a.q_out, &a.k_out}) {
                 const auto st = view->strides;
                 view->layout = rope::Layout::bshd;
                 view->shape = {view->shape[0], 1, view->shape[1], view->shape[2]};
                 view->strides = {st[0], st[0], st[1], st[2]};
             }
         }},
        {"k heads = 0", [](Setup&, rope::KvAppendArgs& a) { a.k.shape[1] = a.k_out.shape[1] = 0; }},
        {"q feature stride = 2",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.spare = testing::make_packed(s.shape.dtype, {7, 4, 32}, 0, 2), a.q = s.spare.view;
         }},
        {"positions.offset = -1", [](Setup&, rope::KvAppendArgs& a) { a.positions.offset = -1; }},
        {"k_cache.scale = null", [](Setup&, rope::KvAppendArgs& a) { a.k_cache.dtype = rope::CacheDType::e4m3fn; }},
        {"v_cache.scale_count = 3",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.k_scales.assign(3, 0.5f);
             a.v_cache.dtype = rope::CacheDType::e5m2, a.v_cache.scale = s.k_scales.data(), a.v_cache.scale_count = 3;
         }},
        {"k_cache.scale[1] = 0",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.k_scales = {0.5f, 0.0f};
             a.k_cache.dtype = rope::CacheDType::e4m3fn, a.k_cache.scale = s.k_scales.data(), a.k_cache.scale_count = 2;
         }},
        {"k_cache.scale[0] = -1",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.k_scales = {-1.0f};
             a.k_cache.dtype = rope::CacheDType::e4m3fn, a.k_cache.scale = s.k_scales.data(), a.k_cache.scale_count = 1;
         }},
        {"k_cache.scale[0] = nan",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.k_scales = {NAN};
             a.k_cache.dtype = rope::CacheDType::e4m3fn, a.k_cache.scale = s.k_scales.data(), a.k_cache.scale_count = 1;
         }},
        {"config.rotary_offset = 8", [](Setup& s, rope::KvAppendArgs&) { s.config.rotary_offset = 8, s.config.rotary_dim = 16; }},
        {"config.style = interleaved_to_half",
         [](Setup& s, rope::KvAppendArgs&) { s.config.style = rope::Style::interleaved_to_half; }},
        {"k_cache.scale[0] = inf",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.k_scales = {INFINITY};
             a.k_cache.dtype = rope::CacheDType::e4m3fn, a.k_cache.scale = s.k_scales.data(), a.k_cache.scale_count = 1;
         }},
    };
    // q's FP8 output (e4m3fn, per-head scales, an 8-byte gap after each row): each rule of
    // check_fp8_output and of the overlaps, with a second part of the message where the parameter
    // alone would not say which rule refused the call.
    struct BadFp8 {
        const char* parameter;
        const char* reason;
        std::function<void(Setup&, rope::KvAppendArgs&)> spoil;
    };
    const BadFp8 fp8_cases[] = {
        {"q_out_fp8.device = cuda", "", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.device = rope::Device::cuda; }},
        {"q_out_fp8.dtype = model", "", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.dtype = rope::CacheDType::model; }},
        {"q_out_fp8.tokens = 6", "", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.tokens = 6; }},
        {"q_out_fp8.tokens = 8", "", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.tokens = 8; }},
        {"q_out_fp8.heads = 2", "", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.heads = 2; }},
        {"q_out_fp8.head_dim = 16", "", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.head_dim = 16; }},
        {"q_out_fp8.stride_token = -1", "", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.stride_token = -1; }},
        {"q_out_fp8.stride_head = -40", "", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.stride_head = -40; }},
        {"q_out_fp8.stride_token = 4611686018427387904", "overflow 64 bits",
         [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.stride_token = int64_t(1) << 62; }},
        {"q_out_fp8.stride_token = 8", "overflow 64 bits",
         [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.stride_token = 8, a.q_out_fp8.stride_head = int64_t(1) << 62; }},
        {"q_out_fp8.strides", "share memory", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.stride_head = 31; }},
        {"q_out_fp8.strides", "share memory",
         [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.stride_token = a.q_out_fp8.stride_head; }},
        {"q_out_fp8.strides", "share memory", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.stride_token = 0; }},
        {"q_out_fp8.scale = null", "", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.scale = nullptr; }},
        {"q_out_fp8.scale_count = 2", "", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.scale_count = 2; }},
        {"q_out_fp8.scale_count = 0", "", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.scale_count = 0; }},
        {"q_out_fp8.scale[2] = 0", "", [](Setup& s, rope::KvAppendArgs&) { s.q_scales[2] = 0.0f; }},
        {"q_out_fp8.scale[0] = -0.5", "", [](Setup& s, rope::KvAppendArgs&) { s.q_scales[0] = -0.5f; }},
        {"q_out_fp8.scale[3] = nan", "", [](Setup& s, rope::KvAppendArgs&) { s.q_scales[3] = NAN; }},
        {"q_out_fp8.scale[1] = inf", "", [](Setup& s, rope::KvAppendArgs&) { s.q_scales[1] = INFINITY; }},
        {"q_out_fp8.scale[0] = 0", "",  // Per tensor: the one scale.
         [](Setup& s, rope::KvAppendArgs& a) { s.q_scales[0] = 0.0f, a.q_out_fp8.scale_count = 1; }},
        {"q_out_fp8.scale", "aligned to 4 bytes",
         [](Setup& s, rope::KvAppendArgs& a) {
             a.q_out_fp8.scale = reinterpret_cast<const float*>(reinterpret_cast<const char*>(s.q_scales.data()) + 1),
             a.q_out_fp8.scale_count = 1;
         }},
        {"q_out_fp8.data = null", "with a scale set", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.data = nullptr; }},
        {"q_out.data", "must be q itself", [](Setup& s, rope::KvAppendArgs& a) { a.q_out = s.q_out.view; }},
        {"q_out_fp8.data", "overlaps q ", [](Setup& s, rope::KvAppendArgs& a) { a.q_out_fp8.data = s.q.storage.data() + 8; }},
        {"q_out_fp8.data", "overlaps k ", [](Setup& s, rope::KvAppendArgs& a) { a.q_out_fp8.data = s.k.storage.data(); }},
        {"q_out_fp8.data", "overlaps v ", [](Setup& s, rope::KvAppendArgs& a) { a.q_out_fp8.data = s.v.storage.data(); }},
        {"q_out_fp8.data", "overlaps k_out",
         [](Setup& s, rope::KvAppendArgs& a) { a.q_out_fp8.data = s.k_out.storage.data(); }},
        // The arrays below are made larger than the FP8 output (over a kilobyte), so that it overlaps
        // them and nothing else of the heap.
        {"q_out_fp8.data", "overlaps slot_mapping.slots",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.ids.assign(200, 0);
             std::copy(s.slots.begin(), s.slots.end(), s.ids.begin() + 50);
             a.slot_mapping.slots = s.ids.data() + 50;
             a.q_out_fp8.data = s.ids.data();
         }},
        {"q_out_fp8.data", "overlaps q_out_fp8.scale",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.q_scales.assign(400, 0.05f);
             a.q_out_fp8.scale = s.q_scales.data() + 100, a.q_out_fp8.data = s.q_scales.data();
         }},
        {"q_out_fp8.data", "overlaps k_cache.scale",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.k_scales.assign(400, 0.5f);
             a.k_cache.dtype = rope::CacheDType::e4m3fn, a.k_cache.scale = s.k_scales.data() + 4, a.k_cache.scale_count = 1;
             a.q_out_fp8.data = s.k_scales.data();
         }},
        {"q_out_fp8.data", "overlaps v_cache.scale",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.v_scales.assign(400, 0.5f);
             a.v_cache.dtype = rope::CacheDType::e5m2, a.v_cache.scale = s.v_scales.data() + 15, a.v_cache.scale_count = 1;
             a.q_out_fp8.data = s.v_scales.data();
         }},
        {"q_out_fp8.data", "overlaps cos_sin_cache",
         [](Setup& s, rope::KvAppendArgs& a) {
             s.table_rows = 64;
             s.table = rope::make_cos_sin_cache(s.config, s.table_rows);
             a.cos_sin_cache = s.cos_sin_cache();
             a.q_out_fp8.data = s.table.data() + 100;
         }},
        {"k_cache.data", "overlaps q_out_fp8 ",
         [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.data = static_cast<char*>(a.k_cache.data) + 100; }},
        {"v_cache.data", "overlaps q_out_fp8 ", [](Setup&, rope::KvAppendArgs& a) { a.q_out_fp8.data = a.v_cache.data; }},
        {"k_cache.data", "overlaps q_out_fp8.scale",  // Valid scales (not the poison) inside the k cache.
         [](Setup&, rope::KvAppendArgs& a) {
             const float scales[4] = {0.1f, 0.2f, 0.3f, 0.4f};
             std::memcpy(static_cast<float*>(a.k_cache.data) + 5, scales, sizeof scales);
             a.q_out_fp8.scale = static_cast<const float*>(a.k_cache.data) + 5;
         }},
    };
    Shape fp8_shape = shape;
    fp8_shape.q_fp8 = rope::CacheDType::e4m3fn;
    fp8_shape.q_fp8_per_head = true;
    fp8_shape.q_fp8_gap = 8;
    fp8_shape.scale = 0.05f;
    for (const BadFp8& bad : fp8_cases) {
        CAPTURE(std::string(bad.parameter));
        CAPTURE(std::string(bad.reason));
        Setup s = make_setup(config_of(32), fp8_shape);
        rope::KvAppendArgs a = s.args();
        {
            // The same call, unspoilt, is accepted (on a copy: the poison below stays unwritten).
            Setup valid = s;
            CHECK_NOTHROW(rope::append_kv(*backend, valid.config, valid.args()));
        }
        bad.spoil(s, a);
        const Setup before = s;
        std::string message;
        try {
            rope::append_kv(*backend, s.config, a);
        } catch (const rope::Error& e) {
            message = e.what();
        }
        CAPTURE(message);
        CHECK(message.find(bad.parameter) != std::string::npos);
        CHECK(message.find(bad.reason) != std::string::npos);
        CHECK(s.q_fp8_bytes == before.q_fp8_bytes);
        CHECK(s.cache_bytes == before.cache_bytes);
        CHECK(s.q_out.storage == before.q_out.storage);
        CHECK(s.k_out.storage == before.k_out.storage);
        CHECK(s.q.storage == before.q.storage);
        CHECK(s.k.storage == before.k.storage);
        CHECK(s.v.storage == before.v.storage);
        CHECK(s.slots == before.slots);
        CHECK(s.q_scales.size() == before.q_scales.size());  // Bytes: a NaN scale is no value to compare.
        CHECK(std::memcmp(s.q_scales.data(), before.q_scales.data(), s.q_scales.size() * 4) == 0);
        CHECK(s.k_scales == before.k_scales);
        CHECK(s.table == before.table);
    }
}

TEST_CASE("append_kv: caches that interleave in one buffer are told apart exactly") {
    // A packed [K|V] buffer and an MLA row interleave k and v within one byte range: accepted;
    // the same caches shifted by one element so that rows share a byte: rejected.
    auto backend = rope::make_backend("cpu-naive");
    for (CacheLayout layout : {CacheLayout::packed_kv, CacheLayout::mla}) {
        Shape shape;
        shape.layout = layout;
        if (layout == CacheLayout::mla) shape.kv_heads = 1, shape.v_dim = 48, shape.q_heads = 2;
        Setup s = make_setup(config_of(32), shape);
        CHECK_NOTHROW(rope::append_kv(*backend, s.config, s.args()));
        rope::KvAppendArgs a = s.args();
        a.v_cache.data = static_cast<float*>(a.v_cache.data) + 1;
        CHECK_THROWS_WITH_AS(rope::append_kv(*backend, s.config, a), doctest::Contains("v_cache.data"), rope::Error);
    }
}

TEST_CASE("docs/api.md: the append_kv example runs as shown") {
    //! [append_kv example]
    // One decode step of three sequences (one new token each), GQA: q 8 heads, k and v 2, head_dim 64.
    rope::RopeConfig config;
    config.head_dim = 64;
    const int64_t tokens = 3, q_heads = 8, kv_heads = 2, dim = 64, pages = 16, page_size = 16;
    std::vector<float> q(tokens * q_heads * dim, 0.5f), k(tokens * kv_heads * dim, 0.25f), v(tokens * kv_heads * dim, 1.0f);
    std::vector<float> k_cache(pages * page_size * kv_heads * dim), v_cache(k_cache.size());

    // Each sequence's length so far is its new token's position (the angle) ...
    const std::vector<int64_t> positions = {17, 3, 40};
    // ... and its page table names the cache slot: slot = page * page_size + offset in the page.
    const std::vector<int64_t> slots = {5 * page_size + 1, 2 * page_size + 3, 9 * page_size + 8};

    auto backend = rope::make_backend("cpu-naive");
    const auto host = rope::Device::host;
    rope::KvAppendArgs args = rope::KvAppendArgs::in_place(
        rope::TensorView::packed(q.data(), rope::DType::f32, host, {tokens, q_heads, dim}),
        rope::TensorView::packed(k.data(), rope::DType::f32, host, {tokens, kv_heads, dim}),
        rope::TensorView::packed(v.data(), rope::DType::f32, host, {tokens, kv_heads, dim}),
        rope::Positions::shared(positions.data(), tokens),
        rope::SlotMapping{slots.data(), tokens, host},
        rope::PagedCache::nhd(k_cache.data(), host, pages, page_size, kv_heads, dim),
        rope::PagedCache::nhd(v_cache.data(), host, pages, page_size, kv_heads, dim));
    rope::append_kv(*backend, config, args);  // q and k rotated in place; k and v appended
    //! [append_kv example]
    // Token 1's rotated k (head 0) is in slot 2 * 16 + 3, and its v beside it in the v cache.
    const int64_t row = (2 * page_size + 3) * kv_heads * dim;
    for (int64_t d = 0; d < dim; ++d) {
        CHECK(k_cache[size_t(row + d)] == k[size_t(kv_heads * dim + d)]);
        CHECK(v_cache[size_t(row + d)] == 1.0f);
    }
    CHECK(k[size_t(kv_heads * dim + 1)] != 0.25f);  // Rotated (position 3).
}

TEST_CASE("randomised differential run: append_kv on every available backend vs the oracle") {
    // Random calls from a seeded engine: pairing, partial rotary, M-RoPE ids, a cos/sin table,
    // precise angles, linear scaling; dtype; tokens, GQA heads, head_dim and v's; pages and page
    // size; cache layout (NHD, HND, packed [K|V], padded pages, MLA) and dtype (model, e4m3fn,
    // e5m2; per-tensor or per-head scales); padding slots and a short slot list; strided q, k,
    // v; in place or not; in a quarter of them an FP8 q output (either format, per-tensor or
    // per-head scales, dense or with gaps). Each runs on every available backend through
    // check_append (the oracle, the cache bytes, the inputs, the FP8 q codes).
    // ROPE_DIFFERENTIAL_CONFIGS sets how many (default 150).
    const char* env = std::getenv("ROPE_DIFFERENTIAL_CONFIGS");
    const long configs = env ? std::min(std::atol(env), 400L) : 150;
    std::mt19937_64 rng(testing::seed() ^ 0xa99e9dULL);
    auto pick = [&](int64_t low, int64_t high) { return std::uniform_int_distribution<int64_t>(low, high)(rng); };
    std::vector<std::unique_ptr<rope::Backend>> backends;
    for (const rope::BackendInfo& info : rope::list_backends())
        if (info.available) backends.push_back(rope::make_backend(info.name));
    for (long index = 0; index < configs; ++index) {
        CAPTURE(index);
        Shape shape;
        shape.layout = CacheLayout(pick(0, 4));
        shape.dtype = rope::DType(pick(0, 2));
        shape.cache_dtype = rope::CacheDType(pick(0, 2));
        shape.per_head_scales = pick(0, 1) == 1;
        shape.scale = float(std::ldexp(1.0 + double(pick(0, 999)) / 1000.0, int(pick(-9, 2))));
        shape.tokens = pick(1, 40);
        shape.kv_heads = shape.layout == CacheLayout::mla ? 1 : pick(1, 4);
        shape.q_heads = shape.kv_heads * pick(0, 3);  // 0: k alone.
        shape.head_dim = 2 * pick(1, 48);
        shape.v_dim = shape.layout == CacheLayout::packed_kv ? shape.head_dim : pick(1, 96);
        shape.page_size = pick(1, 16);
        shape.pages = (shape.tokens + shape.page_size - 1) / shape.page_size + pick(0, 4);
        shape.tail = pick(0, shape.tokens);
        shape.padding = pick(0, 3);
        shape.in_place = pick(0, 1) == 1;
        shape.q_pad = pick(0, 1) * pick(1, 5);
        if (pick(0, 3) == 0) {  // An FP8 q output (q_out is then q).
            shape.q_fp8 = rope::CacheDType(pick(1, 2));
            shape.q_fp8_per_head = pick(0, 1) == 1;
            shape.q_fp8_gap = pick(0, 1) * pick(1, 17);
        }
        rope::RopeConfig config = config_of(shape.head_dim, 2 * pick(1, shape.head_dim / 2),
                                            pick(0, 1) ? rope::Style::interleaved : rope::Style::half_split);
        const int64_t pairs = config.effective_rotary_dim() / 2;
        const int64_t form = pick(0, 4);  // offset, M-RoPE ids, table, precise, linear
        if (form == 1 && pairs >= 3) {
            config.multi_axis.assignment = pick(0, 1) ? rope::AxisAssignment::mrope_contiguous : rope::AxisAssignment::single;
            if (config.multi_axis.assignment != rope::AxisAssignment::single) {
                const int64_t t = pick(1, pairs - 2), h = pick(1, pairs - t - 1);
                config.multi_axis.sections = {t, h, pairs - t - h};
            }
        }
        if (form == 3) config.precise_angles = true;
        if (form == 4) config.scaling.type = rope::ScalingType::linear, config.scaling.factor = 1.0 + double(pick(0, 30));
        Setup s = make_setup(config, shape);
        if (form == 1) {
            s.axes = config.multi_axis.axes();
            for (int64_t a = 0; a < s.axes; ++a)
                for (int64_t t = 0; t < shape.tokens; ++t) s.ids.push_back(pick(0, 4000));
        }
        if (form == 2) {
            s.table_rows = s.offset + shape.tokens + pick(0, 10);
            s.table = rope::make_cos_sin_cache(config, s.table_rows);
        }
        if (form == 3) s.offset = pick(0, 1000000);
        for (const auto& backend : backends) {
            if (config.effective_rotary_dim() > backend->limits().max_rotary_dim) continue;
            check_append(*backend, s);
        }
    }
}

// Fused QK-RMSNorm + RoPE (rope::apply_qk_norm) on every backend, against the float64
// oracle (oracle::qk_norm: RMSNorm from its definition, then oracle::rotate). Fresh random
// inputs, outputs poisoned with NaN. Tolerances:
//  - float32 rounding, bf16/fp16 storage: every element within one ulp of the float64
//    result rounded to the storage type (and at least 2e-6, float32's rounding of values of
//    order 1, where the rotation cancels to nearly 0);
//  - float32 storage (any rounding): relative L2 error <= 2e-6;
//  - the HF rounding modes in bf16 round several times on purpose: relative L2 <= 1e-2
//    against float64, and every backend bit for bit equal to cpu-naive's (host) or within
//    one ulp of the rotation's operands (CUDA, whose sincosf may differ from the host's
//    cos/sin in the last bit).
// HuggingFace's own modules, bit for bit: python/tests/test_qk_norm.py.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend_tags.hpp"
#include "oracle.hpp"
#include "rope/backend.hpp"
#include "rope/buffer.hpp"
#include "rope/detail/qk_norm_plan.hpp"
#include "rope/error.hpp"
#include "rope/qk_norm.hpp"
#include "rounding_device.hpp"
#include "support.hpp"

using testing::HostTensor;

namespace {

// Spacing of the storage type's values at |v| (float32: its ulp).
double ulp_of(double v, rope::DType dtype) {
    const int mantissa = dtype == rope::DType::bf16 ? 7 : dtype == rope::DType::f16 ? 10 : 23;
    const int min_exponent = dtype == rope::DType::f16 ? -14 : -126;
    const int exponent = v == 0 ? min_exponent : std::max(int(std::floor(std::log2(std::fabs(v)))), min_exponent);
    return std::ldexp(1.0, exponent - mantissa);
}

// Nearest value of the storage type to v (ties to even), computed in double.
double round_to_storage(double v, rope::DType dtype) {
    const double ulp = ulp_of(v, dtype);
    return std::nearbyint(v / ulp) * ulp;
}

// A weight: random values (Llama-style around 1, Gemma-style around 0), stored as `dtype`.
struct Weight {
    std::vector<uint16_t> storage;
    std::vector<double> values;
    rope::NormWeight view;
};

Weight make_weight(int64_t size, rope::DType dtype, bool gemma, std::mt19937_64& rng) {
    Weight weight;
    HostTensor t = HostTensor::make(dtype, rope::Layout::bhsd, {1, 1, 1, size});
    std::uniform_real_distribution<double> uniform(gemma ? -0.5 : 0.5, gemma ? 0.5 : 1.5);
    for (int64_t i = 0; i < size; ++i) {
        const double v = uniform(rng);
        if (dtype == rope::DType::f32) {
            const float f = float(v);
            std::memcpy(t.storage.data() + 2 * i, &f, 4);
        } else if (dtype == rope::DType::f16) {
            const _Float16 h = _Float16(v);
            std::memcpy(t.storage.data() + i, &h, 2);
        } else {
            const float f = float(round_to_storage(v, rope::DType::bf16));
            uint32_t bits;
            std::memcpy(&bits, &f, 4);
            t.storage[size_t(i)] = uint16_t(bits >> 16);
        }
    }
    weight.values = oracle::values(t.view);
    weight.storage = t.storage;
    weight.view = rope::NormWeight{weight.storage.data(), dtype, rope::Device::host, size};
    return weight;
}

// Host memory handed to a CUDA backend as device copies, and the results copied back.
class Staging {
public:
    explicit Staging(bool device) : device_(device) {}
    // The device address of [host, host + bytes) (the host address itself for a CPU backend).
    template <typename T>
    T* put(T* host, size_t bytes) {
        if (!device_ || host == nullptr) return host;
        copies_.push_back({rope::Buffer(rope::Device::cuda, bytes), const_cast<void*>(static_cast<const void*>(host))});
        copies_.back().buffer.copy_from_host(host);
        return static_cast<T*>(copies_.back().buffer.data());
    }
    // A tensor's whole storage, with its view re-pointed.
    rope::TensorView put(HostTensor& tensor) {
        rope::TensorView view = tensor.view;
        auto* base = put(tensor.storage.data(), tensor.bytes());
        view.data = base + (static_cast<uint16_t*>(tensor.view.data) - tensor.storage.data());
        if (device_) view.device = rope::Device::cuda;
        return view;
    }
    void copy_back() {
        for (auto& copy : copies_) copy.buffer.copy_to_host(copy.host);
    }
    rope::Device device() const { return device_ ? rope::Device::cuda : rope::Device::host; }
    // A weight's view, pointing at its (staged) storage.
    rope::NormWeight put(const Weight& weight) {
        rope::NormWeight view = weight.view;
        view.data = put(weight.storage.data(), weight.storage.size() * 2);
        view.device = device();
        return view;
    }

private:
    struct Copy {
        rope::Buffer buffer;
        void* host;
    };
    bool device_;
    std::vector<Copy> copies_;
};

// One call: q and k (views of any layout), their outputs, weights, and what it asks for.
struct Case {
    rope::RopeConfig config;
    rope::DType dtype = rope::DType::bf16;
    rope::Layout layout = rope::Layout::bshd;
    int64_t batch = 2, seq = 5, q_heads = 4, k_heads = 2;
    rope::QkNormKind kind = rope::QkNormKind::per_head;
    rope::QkNormRounding rounding = rope::QkNormRounding::float32;
    bool in_place = false;
    rope::DType weight_dtype = rope::DType::f32;
    int64_t pad = 0;
    std::vector<int64_t> ids;    // [axes, 1, seq] explicit ids, or empty: 0, 1, ...
    std::vector<float> table;    // a caller's cos/sin table, or empty
    int64_t table_rows = 0;
};

std::array<int64_t, 4> shape_of(const Case& c, int64_t heads) {
    return c.layout == rope::Layout::bshd ? std::array<int64_t, 4>{c.batch, c.seq, heads, c.config.head_dim}
                                          : std::array<int64_t, 4>{c.batch, heads, c.seq, c.config.head_dim};
}

struct Result {
    std::vector<double> q, k, q_want, k_want;
};

Result run_case(rope::Backend& backend, const Case& c) {
    auto& rng = testing::rng();
    testing::Call call =
        testing::make_call(c.config, c.dtype, c.layout, shape_of(c, c.q_heads), shape_of(c, c.k_heads), c.pad);
    HostTensor &q = call.q, &k = call.k, &q_out = call.q_out, &k_out = call.k_out;
    const bool gemma = c.kind == rope::QkNormKind::per_head_gemma, across = c.kind == rope::QkNormKind::across_heads;
    const Weight qw = make_weight(across ? c.q_heads * c.config.head_dim : c.config.head_dim, c.weight_dtype, gemma, rng);
    const Weight kw = make_weight(across ? c.k_heads * c.config.head_dim : c.config.head_dim, c.weight_dtype, gemma, rng);
    const int64_t axes = c.config.multi_axis.axes();
    rope::Positions positions = c.ids.empty() ? rope::Positions{}
                                              : rope::Positions::multi_axis(c.ids.data(), axes, 1, c.seq);
    rope::CosSinCache table{};
    if (!c.table.empty())
        table = rope::CosSinCache::dense(c.table.data(), c.table_rows, c.config.effective_rotary_dim());

    Result result;
    result.q_want = oracle::qk_norm(c.config, q.view, qw.values, gemma, across, 1e-6, positions, table);
    result.k_want = oracle::qk_norm(c.config, k.view, kw.values, gemma, across, 1e-6, positions, table);

    Staging stage(backend.device() == rope::Device::cuda);
    rope::QkNormArgs args;
    args.q = stage.put(q);
    args.k = stage.put(k);
    args.q_out = c.in_place ? args.q : stage.put(q_out);
    args.k_out = c.in_place ? args.k : stage.put(k_out);
    args.q_weight = stage.put(qw);
    args.k_weight = stage.put(kw);
    args.kind = c.kind;
    args.rounding = c.rounding;
    args.eps = 1e-6;
    args.positions = positions;
    if (!c.ids.empty()) {
        args.positions.ids = stage.put(c.ids.data(), c.ids.size() * 8);
        args.positions.device = stage.device();
    }
    args.cos_sin_cache = table;
    if (table.data != nullptr) {
        args.cos_sin_cache.data = stage.put(c.table.data(), c.table.size() * 4);
        args.cos_sin_cache.device = stage.device();
    }
    rope::apply_qk_norm(backend, c.config, args);
    stage.copy_back();
    result.q = (c.in_place ? q : q_out).values();
    result.k = (c.in_place ? k : k_out).values();
    return result;
}

// run_case with the generator reseeded to `state` first: two backends run from the same state see
// the same inputs and weights (the same draws).
Result run_seeded(rope::Backend& backend, const Case& c, uint64_t state) {
    testing::rng().seed(state);
    return run_case(backend, c);
}

// Every element within one ulp of the float64 result rounded to storage (bf16, fp16),
// or relative L2 <= 2e-6 (fp32 storage).
void check_float32_mode(const std::vector<double>& got, const std::vector<double>& want, rope::DType dtype,
                        const std::string& what) {
    INFO(what, " seed ", testing::seed());
    REQUIRE(got.size() == want.size());
    if (dtype == rope::DType::f32) {
        const oracle::ErrorStats stats = oracle::compare(got, want);
        CHECK(stats.non_finite == 0);
        CHECK(stats.rel_l2 <= 2e-6);
        return;
    }
    long bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double rounded = round_to_storage(want[i], dtype);
        // One ulp, and at least 2e-6: float32's own rounding of the normalised values (of order 1),
        // visible where x cos - y sin cancels to nearly 0.
        const double ulp = std::max({ulp_of(rounded, dtype), ulp_of(got[i], dtype), 2e-6});
        if (!(std::fabs(got[i] - rounded) <= ulp)) {
            if (bad++ < 3) MESSAGE("element ", i, ": got ", got[i], ", float64 ", want[i], " rounds to ", rounded);
        }
    }
    CHECK(bad == 0);
}

std::vector<rope::DType> dtypes() { return {rope::DType::f32, rope::DType::bf16, rope::DType::f16}; }

rope::RopeConfig config_of(int64_t head_dim, int64_t rotary_dim, rope::Style style) {
    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.rotary_dim = rotary_dim;
    config.style = style;
    return config;
}

// A head_dim 128 call in a rounding mode, the weights in the model's dtype.
Case rounding_case(rope::DType dtype, rope::QkNormRounding rounding, rope::QkNormKind kind, bool in_place) {
    Case c;
    c.config = config_of(128, 0, rope::Style::half_split);
    c.dtype = dtype;
    c.kind = kind;
    c.rounding = rounding;
    c.weight_dtype = dtype;
    c.in_place = in_place;
    return c;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("qk_norm float32 mode: kinds x dtypes x styles x layouts, within one ulp of float64", B,
                          qk_norm_float32) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (const rope::DType dtype : dtypes())
        for (const rope::QkNormKind kind :
             {rope::QkNormKind::per_head, rope::QkNormKind::per_head_gemma, rope::QkNormKind::across_heads})
            for (const rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
                Case c;
                c.config = config_of(64, style == rope::Style::half_split ? 0 : 32, style);  // one partial
                c.dtype = dtype;
                c.kind = kind;
                c.layout = style == rope::Style::half_split ? rope::Layout::bshd : rope::Layout::bhsd;
                c.in_place = kind == rope::QkNormKind::per_head_gemma;
                c.pad = kind == rope::QkNormKind::across_heads ? 3 : 0;
                c.weight_dtype = kind == rope::QkNormKind::per_head ? dtype : rope::DType::f32;
                const std::string what = std::string(rope::dtype_name(dtype)) + " " +
                                         std::string(rope::qk_norm_kind_name(kind)) + " " +
                                         std::string(rope::style_name(style));
                const Result r = run_case(*backend, c);
                check_float32_mode(r.q, r.q_want, dtype, "q " + what);
                check_float32_mode(r.k, r.k_want, dtype, "k " + what);
            }
}
TEST_CASE_TEMPLATE_APPLY(qk_norm_float32, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("qk_norm with M-RoPE ids, a caller's table and a head_dim of 128 and 80", B, qk_norm_forms) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (const rope::DType dtype : {rope::DType::f32, rope::DType::bf16}) {
        Case mrope;
        mrope.config = config_of(128, 0, rope::Style::half_split);
        mrope.config.multi_axis = {rope::AxisAssignment::mrope_contiguous, {16, 24, 24}};
        mrope.dtype = dtype;
        mrope.seq = 6;
        mrope.kind = rope::QkNormKind::across_heads;
        for (int64_t a = 0; a < 3; ++a)
            for (int64_t s = 0; s < mrope.seq; ++s) mrope.ids.push_back(3 + s * (a + 1) + a * 7);
        const Result m = run_case(*backend, mrope);
        check_float32_mode(m.q, m.q_want, dtype, "mrope q");
        check_float32_mode(m.k, m.k_want, dtype, "mrope k");

        Case table;
        table.config = config_of(80, 0, rope::Style::half_split);  // 80: not a multiple of the 8-lane sum
        table.config.scaling.type = rope::ScalingType::linear;
        table.config.scaling.factor = 2.0;
        table.dtype = dtype;
        table.kind = rope::QkNormKind::per_head_gemma;
        table.table_rows = 64;
        table.table = rope::make_cos_sin_cache(table.config, table.table_rows);
        const Result t = run_case(*backend, table);
        check_float32_mode(t.q, t.q_want, dtype, "table q");
        check_float32_mode(t.k, t.k_want, dtype, "table k");
    }
}
TEST_CASE_TEMPLATE_APPLY(qk_norm_forms, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("qk_norm HF rounding modes: near float64, and the same bits as cpu-naive", B, qk_norm_hf) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    auto naive = rope::make_backend("cpu-naive");
    const std::pair<rope::QkNormRounding, rope::QkNormKind> modes[] = {
        {rope::QkNormRounding::hf_qwen3, rope::QkNormKind::per_head},
        {rope::QkNormRounding::hf_gemma3, rope::QkNormKind::per_head_gemma},
        {rope::QkNormRounding::hf_olmo2, rope::QkNormKind::across_heads}};
    for (const rope::DType dtype : dtypes())
        for (const auto& [rounding, kind] : modes) {
            const Case c = rounding_case(dtype, rounding, kind, rounding == rope::QkNormRounding::hf_olmo2);
            const std::string what = std::string(rope::dtype_name(dtype)) + " " +
                                     std::string(rope::qk_norm_rounding_name(rounding));
            INFO(what, " seed ", testing::seed());
            const uint64_t state = testing::seed() ^ uint64_t(dtype) * 31 ^ uint64_t(rounding);
            const Result got = run_seeded(*backend, c, state);
            const Result reference = run_seeded(*naive, c, state);  // the same inputs
            REQUIRE(got.q_want == reference.q_want);
            for (const auto* pair : {&got.q, &got.k}) {
                const auto& want = pair == &got.q ? got.q_want : got.k_want;
                const oracle::ErrorStats stats = oracle::compare(*pair, want);
                CHECK(stats.non_finite == 0);
                CHECK(stats.rel_l2 <= (dtype == rope::DType::f32 ? 2e-6 : 1e-2));
            }
            if (backend->device() == rope::Device::host) {
                CHECK(got.q == reference.q);
                CHECK(got.k == reference.k);
            } else {
                // CUDA's sincosf is within 2 ulp of the exact cos/sin, the host's within 1, so the two may
                // differ by 3 float32 ulps. In float32 storage that moves each product of x cos - y sin by
                // 3 ulps of the largest operand, plus the result's rounding: 7 in all. Rounded to a half
                // dtype (the HF modes round cos and sin to it), the difference flips cos and sin by at
                // most one ulp of that dtype each, plus the rounding: 3. The operands are bounded by the
                // largest result (a rotation keeps each pair's length; Gemma's 1 + w takes them past 2).
                double largest = 2.0;
                for (const auto* values : {&reference.q, &reference.k})
                    for (const double value : *values) largest = std::max(largest, std::fabs(value));
                const double operand_ulp = (dtype == rope::DType::f32 ? 7 : 3) * ulp_of(largest, dtype);
                double worst = 0;
                for (size_t i = 0; i < got.q.size(); ++i) worst = std::max(worst, std::fabs(got.q[i] - reference.q[i]));
                for (size_t i = 0; i < got.k.size(); ++i) worst = std::max(worst, std::fabs(got.k[i] - reference.k[i]));
                CHECK(worst <= operand_ulp);
            }
        }
}
TEST_CASE_TEMPLATE_APPLY(qk_norm_hf, AllBackends);

// cuda-optimized computes a token's cos and sin once per block and shares them across the block's heads.
// cuda-naive computes them pair by pair and head by head with the same sincosf, so the two agree bit for
// bit. The shapes take each of cuda-optimized's per-head paths, in every rounding mode of the per-head
// kinds: the quad-per-row kernel with a token's heads in one block (Qwen3-8B's 32 + 8, and 12 + 3 with
// gaps between rows that keep them 16-byte aligned), over several blocks (128 + 8), interleaved over part
// of the head, at each head_dim it is compiled for; the generic kernel (head_dim 80, not a multiple of
// 32; half-split over part of the head; rows not 16-byte aligned), a token's heads over two blocks of
// eight.
TEST_CASE("qk_norm: cuda-optimized gives cuda-naive's bits, on each of its per-head paths") {
    auto optimized = testing::backend_or_skip("cuda-optimized");
    auto naive = testing::backend_or_skip("cuda-naive");
    if (!optimized || !naive) return;
    const std::pair<rope::QkNormRounding, rope::QkNormKind> modes[] = {
        {rope::QkNormRounding::float32, rope::QkNormKind::per_head},
        {rope::QkNormRounding::float32, rope::QkNormKind::per_head_gemma},
        {rope::QkNormRounding::hf_qwen3, rope::QkNormKind::per_head},
        {rope::QkNormRounding::hf_gemma3, rope::QkNormKind::per_head_gemma}};
    struct Shape {
        int64_t head_dim, rotary_dim;  // rotary_dim 0: the whole head
        rope::Style style;
        int64_t q_heads, k_heads, pad;  // pad: spare elements after each row (HostTensor::make)
    };
    constexpr rope::Style half = rope::Style::half_split, interleaved = rope::Style::interleaved;
    const Shape shapes[] = {{128, 0, half, 32, 8, 0},        {128, 0, half, 12, 3, 8}, {128, 0, half, 128, 8, 0},
                            {128, 64, interleaved, 12, 3, 0}, {64, 0, half, 12, 3, 0},  {256, 0, interleaved, 12, 3, 0},
                            {80, 0, half, 12, 3, 0},          {128, 64, half, 12, 3, 0}, {128, 0, half, 12, 3, 3}};
    for (const rope::DType dtype : dtypes())
        for (const Shape& shape : shapes)
            for (const auto& [rounding, kind] : modes) {
                const int64_t q_heads = shape.q_heads, k_heads = shape.k_heads;
                Case c = rounding_case(dtype, rounding, kind, rounding == rope::QkNormRounding::hf_qwen3);
                c.config = config_of(shape.head_dim, shape.rotary_dim, shape.style);
                c.q_heads = q_heads;
                c.k_heads = k_heads;
                c.pad = shape.pad;
                // A string first: INFO's lambda cannot capture a structured binding under clang's OpenMP.
                const std::string what = std::string(rope::dtype_name(dtype)) + " " +
                                         std::string(rope::qk_norm_rounding_name(rounding)) + " " +
                                         std::string(rope::style_name(shape.style)) + " " +
                                         std::to_string(q_heads) + "+" + std::to_string(k_heads) + " heads of " +
                                         std::to_string(shape.head_dim) + ", rotary_dim " +
                                         std::to_string(shape.rotary_dim) + ", pad " + std::to_string(shape.pad);
                INFO(what, ", seed ", testing::seed());
                const uint64_t state = testing::seed() ^ uint64_t(q_heads) * 131 ^ uint64_t(shape.head_dim) * 17 ^
                                       uint64_t(rounding) * 7;
                const Result got = run_seeded(*optimized, c, state);
                const Result reference = run_seeded(*naive, c, state);  // the same inputs
                CHECK(got.q == reference.q);
                CHECK(got.k == reference.k);
            }
}

namespace {

// A packed [tokens, (q_heads + 2 kv_heads) * head_dim] buffer, random, with room for padding per row.
struct Packed {
    HostTensor buffer;  // bshd [1, tokens, 1, row_stride]: the storage and its values
    rope::QkvBuffer qkv;
};

Packed make_packed_qkv(rope::DType dtype, int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                       int64_t row_pad) {
    Packed p;
    const int64_t width = (q_heads + 2 * kv_heads) * head_dim;
    p.buffer = HostTensor::make(dtype, rope::Layout::bshd, {1, tokens, 1, width + row_pad});
    p.buffer.fill_random();
    p.qkv = rope::QkvBuffer{p.buffer.view.data, dtype, rope::Device::host, tokens, width, q_heads, kv_heads,
                            width + row_pad};
    return p;
}

// A thd view of heads [first, first + heads) of each row of the packed buffer.
rope::TensorView slice(const Packed& p, int64_t first_head, int64_t heads, int64_t head_dim) {
    rope::TensorView view;
    view.data = static_cast<char*>(p.qkv.data) + first_head * head_dim * rope::dtype_size(p.qkv.dtype);
    view.dtype = p.qkv.dtype;
    view.layout = rope::Layout::thd;
    view.shape = {p.qkv.tokens, heads, head_dim, 1};
    view.strides = {p.qkv.row_stride, head_dim, 1, 0};
    return view;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("qk_norm on a packed qkv buffer: q and k in place, v untouched or copied to v_out", B,
                          qk_norm_packed) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    auto& rng = testing::rng();
    const int64_t tokens = 7, q_heads = 4, kv_heads = 2, head_dim = 64;
    const rope::RopeConfig config = config_of(head_dim, 0, rope::Style::half_split);
    for (const rope::DType dtype : {rope::DType::bf16, rope::DType::f32})
        for (const bool copy_v : {false, true}) {
            INFO(rope::dtype_name(dtype), copy_v ? " v copied" : " v untouched", " seed ", testing::seed());
            Packed p = make_packed_qkv(dtype, tokens, q_heads, kv_heads, head_dim, 8);
            const Packed before = p;
            const std::vector<double> v_before = oracle::values(slice(before, q_heads + kv_heads, kv_heads, head_dim));
            const Weight qw = make_weight(head_dim, rope::DType::f32, false, rng);
            const Weight kw = make_weight(head_dim, rope::DType::f32, false, rng);
            const auto q_want = oracle::qk_norm(config, slice(before, 0, q_heads, head_dim), qw.values, false, false,
                                                1e-6, {}, {});
            const auto k_want = oracle::qk_norm(config, slice(before, q_heads, kv_heads, head_dim), kw.values, false,
                                                false, 1e-6, {}, {});
            HostTensor v_out = HostTensor::make(dtype, rope::Layout::thd, {tokens, kv_heads, head_dim, 1});
            v_out.poison();

            Staging stage(backend->device() == rope::Device::cuda);
            rope::QkNormArgs args = rope::QkNormArgs::packed(p.qkv);
            args.qkv.data = stage.put(p.buffer).data;
            args.qkv.device = stage.device();
            if (copy_v) args.v_out = stage.put(v_out);
            args.q_weight = stage.put(qw);
            args.k_weight = stage.put(kw);
            rope::apply_qk_norm(*backend, config, args);
            stage.copy_back();

            check_float32_mode(oracle::values(slice(p, 0, q_heads, head_dim)), q_want, dtype, "packed q");
            check_float32_mode(oracle::values(slice(p, q_heads, kv_heads, head_dim)), k_want, dtype, "packed k");
            CHECK(oracle::values(slice(p, q_heads + kv_heads, kv_heads, head_dim)) == v_before);  // v untouched
            // v and the row padding after it, byte for byte.
            const size_t element = rope::dtype_size(dtype), row_bytes = size_t(p.qkv.row_stride) * element;
            const size_t v_start = size_t((q_heads + kv_heads) * head_dim) * element;
            for (int64_t t = 0; t < tokens; ++t) {
                const auto* now = static_cast<const char*>(p.qkv.data) + size_t(t) * row_bytes;
                const auto* then = static_cast<const char*>(before.qkv.data) + size_t(t) * row_bytes;
                CHECK(std::memcmp(now + v_start, then + v_start, row_bytes - v_start) == 0);
            }
            if (copy_v) CHECK(v_out.values() == v_before);
        }
}
TEST_CASE_TEMPLATE_APPLY(qk_norm_packed, AllBackends);

TEST_CASE("qk_norm bad input: a clear error naming the parameter, nothing written") {
    auto backend = rope::make_backend("cpu-naive");
    auto& rng = testing::rng();
    const rope::RopeConfig config = config_of(64, 0, rope::Style::half_split);
    testing::Call call =
        testing::make_call(config, rope::DType::bf16, rope::Layout::bshd, {1, 4, 4, 64}, {1, 4, 2, 64});
    HostTensor &q = call.q, &k = call.k, &q_out = call.q_out, &k_out = call.k_out;
    const HostTensor q_out_before = q_out, k_out_before = k_out;
    const Weight w = make_weight(64, rope::DType::f32, false, rng);
    const Weight w_bf16 = make_weight(64, rope::DType::bf16, false, rng);
    const Weight w_f16 = make_weight(64, rope::DType::f16, false, rng);
    const Weight w_across = make_weight(4 * 64, rope::DType::f32, false, rng);
    auto good = [&] {
        rope::QkNormArgs args;
        args.q = q.view;
        args.k = k.view;
        args.q_out = q_out.view;
        args.k_out = k_out.view;
        args.q_weight = args.k_weight = w.view;
        return args;
    };
    auto refused = [&](const std::function<void(rope::QkNormArgs&)>& edit, const std::string& parameter) {
        rope::QkNormArgs args = good();
        edit(args);
        INFO("expected an error naming ", parameter);
        bool thrown = false;
        try {
            rope::apply_qk_norm(*backend, config, args);
        } catch (const rope::Error& error) {
            thrown = true;
            CHECK_MESSAGE(std::string(error.what()).find(parameter) != std::string::npos, error.what());
        }
        CHECK(thrown);
        CHECK(q_out.storage == q_out_before.storage);  // nothing written
        CHECK(k_out.storage == k_out_before.storage);
    };
    refused([&](auto& a) { a.q_weight.size = 63; }, "q_weight.size");
    refused([&](auto& a) { a.k_weight = w_across.view; }, "k_weight.size");
    refused([&](auto& a) { a.kind = rope::QkNormKind::across_heads; }, "q_weight.size");  // needs heads * head_dim
    refused([&](auto& a) { a.q_weight.data = nullptr; }, "q_weight.data");
    refused([&](auto& a) { a.q_weight = w_f16.view; }, "q_weight.dtype");  // neither fp32 nor the tensors' bf16
    refused([&](auto& a) { a.q_weight.device = rope::Device::cuda; }, "q_weight.device");
    for (const double eps : {0.0, -1e-6, std::nan(""), double(INFINITY), 1e-50, 1e300})
        refused([&](auto& a) { a.eps = eps; }, "eps");
    refused([&](auto& a) { a.k_out.shape[3] = 32; }, "k_out");  // mismatched shapes
    refused([&](auto& a) { a.k.shape[3] = 32; }, "k head_dim");
    refused([&](auto& a) { a.q_out = a.k_out; }, "q_out");
    refused([&](auto& a) { a.v_out = q_out.view; }, "v_out.data");  // v_out without a qkv buffer
    refused([&](auto& a) { a.q_weight.data = q_out.view.data; a.q_weight.dtype = rope::DType::bf16; }, "q_out.data");
    refused([&](auto& a) { a.kind = static_cast<rope::QkNormKind>(7); }, "kind");
    refused([&](auto& a) { a.rounding = static_cast<rope::QkNormRounding>(9); }, "rounding");
    {  // The fused loops rotate from feature 0 and write each pair where they read it.
        rope::RopeConfig windowed = config;
        windowed.rotary_offset = 32, windowed.rotary_dim = 32;
        CHECK_THROWS_WITH_AS(rope::apply_qk_norm(*backend, windowed, good()), doctest::Contains("config.rotary_offset = 32"),
                             rope::Error);
        rope::RopeConfig reordered = config;
        reordered.style = rope::Style::interleaved_to_half;
        CHECK_THROWS_WITH_AS(rope::apply_qk_norm(*backend, reordered, good()), doctest::Contains("config.style"),
                             rope::Error);
        CHECK(q_out.storage == q_out_before.storage);
        CHECK(k_out.storage == k_out_before.storage);
    }
    // The weight in the model's dtype is accepted.
    rope::QkNormArgs ok = good();
    ok.q_weight = w_bf16.view;
    CHECK_NOTHROW(rope::apply_qk_norm(*backend, config, ok));

    // A qkv buffer whose head counts do not add up to its row, or given with q as well.
    Packed p = make_packed_qkv(rope::DType::bf16, 3, 4, 2, 64, 0);
    const std::vector<uint16_t> packed_before = p.buffer.storage;
    auto packed_refused = [&](const std::function<void(rope::QkNormArgs&)>& edit, const std::string& parameter) {
        rope::QkNormArgs args = rope::QkNormArgs::packed(p.qkv);
        args.q_weight = args.k_weight = w.view;
        edit(args);
        INFO("expected an error naming ", parameter);
        CHECK_THROWS_WITH_AS(rope::apply_qk_norm(*backend, config, args), doctest::Contains(parameter.c_str()),
                             rope::Error);
        CHECK(p.buffer.storage == packed_before);
    };
    packed_refused([](auto& a) { a.qkv.kv_heads = 3; }, "qkv.width");
    packed_refused([](auto& a) { a.qkv.q_heads = 5; }, "qkv.width");
    packed_refused([](auto& a) { a.qkv.width -= 64; }, "qkv.width");
    packed_refused([](auto& a) { a.qkv.row_stride = 10; }, "qkv.row_stride");
    packed_refused([](auto& a) { a.qkv.tokens = -1; }, "qkv.tokens");
    packed_refused([&](auto& a) { a.q = q.view; }, "q.data");
    packed_refused([&](auto& a) { a.v_out = q_out.view; }, "v_out.shape");
    packed_refused([&](auto& a) { a.v_out = slice(p, 0, 2, 64); }, "v_out.data");  // v_out inside the buffer
}

#if !ROPE_HAVE_CUDA
std::vector<float> testing::cuda::bf16_pairs_on_device(const std::vector<float>&) {
    throw rope::Error("rope::Error: bf16_pairs_on_device: this build has no CUDA");
}
#endif

TEST_CASE("CUDA: round_pair_to's paired bf16 conversion gives round_to's bits") {
    // HF-exact QK-norm rounds two values per instruction on the GPU (cvt.rn.bf16x2.f32);
    // each result must be the bits of rounding it alone (NaN: a NaN): ties to even, NaN, inf,
    // the largest finite values, subnormals, and random patterns, each in both places of a pair.
    const rope::BackendInfo info = rope::backend_info("cuda-naive");
    if (!info.available) {
        testing::report_skip("round_pair_to on the GPU", info.reason);
        return;
    }
    auto of_bits = [](uint32_t bits) {
        float value;
        std::memcpy(&value, &bits, sizeof value);
        return value;
    };
    std::vector<float> values;
    for (uint32_t kept : {0x3f80u, 0x3f81u, 0x7f7fu, 0x0001u, 0x0080u, 0x8000u, 0xbf81u, 0xff7fu})
        for (uint32_t dropped : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
            values.push_back(of_bits(kept << 16 | dropped));  // Exact, below, at and above the tie.
    for (uint32_t special : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x00000000u,
                             0x80000000u, 0x7f7fffffu, 0x00000001u})
        values.push_back(of_bits(special));
    std::mt19937_64 rng(testing::seed());
    for (int i = 0; i < 100000; ++i) values.push_back(of_bits(uint32_t(rng())));
    // Each value in the first place of a pair, then (shifted by one) in the second.
    for (int shift : {0, 1}) {
        CAPTURE(shift);
        std::vector<float> input(values.begin() + shift, values.end());
        const std::vector<float> device = testing::cuda::bf16_pairs_on_device(input);
        REQUIRE(device.size() == input.size());
        int mismatches = 0;
        for (size_t i = 0; i < input.size(); ++i) {
            uint32_t got, want;
            const float host = rope::detail::round_to<rope::bfloat16>(input[i]);
            std::memcpy(&got, &device[i], sizeof got);
            std::memcpy(&want, &host, sizeof want);
            // A NaN's bits are each side's own (the GPU's one NaN, the host's quieted input),
            // as they are for round_to on the GPU: NaN must stay NaN.
            const bool same = std::isnan(input[i]) ? std::isnan(device[i]) : got == want;
            if (!same && ++mismatches <= 10)
                FAIL_CHECK("value " << i << ": the GPU's paired rounding gives 0x" << std::hex << got << ", round_to 0x"
                                    << want);
        }
        CHECK(mismatches == 0);
    }
}

#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <doctest/doctest.h>

namespace testing {

uint64_t seed() {
    static const uint64_t value = [] {
        if (const char* env = std::getenv("ROPE_TEST_SEED")) return uint64_t(std::strtoull(env, nullptr, 10));
        std::random_device device;
        return (uint64_t(device()) << 32) ^ device();
    }();
    return value;
}

std::mt19937_64& rng() {
    static std::mt19937_64 engine(seed());
    return engine;
}

HostTensor HostTensor::make(rope::DType dtype, rope::Layout layout, std::array<int64_t, 4> shape, int64_t pad,
                            int64_t dim_stride) {
    HostTensor t;
    t.view.dtype = dtype;
    t.view.layout = layout;
    t.view.device = rope::Device::host;
    t.view.shape = shape;
    // Row-major with gaps: features spaced by dim_stride, `pad` spare elements after each row,
    // and the same again after each block of the second axis.
    t.view.strides[3] = dim_stride;
    t.view.strides[2] = shape[3] * dim_stride + pad;
    t.view.strides[1] = shape[2] * t.view.strides[2] + pad;
    t.view.strides[0] = shape[1] * t.view.strides[1] + pad;
    const int64_t elements = std::max<int64_t>(shape[0], 0) * t.view.strides[0] + pad;
    t.storage.assign(size_t(elements * rope::dtype_size(dtype) / 2), 0);
    t.view.data = t.storage.data();
    return t;
}

void HostTensor::fill_random() {
    std::uniform_real_distribution<float> magnitude(0.05f, 2.0f);
    std::bernoulli_distribution negative(0.5);
    const int64_t count = int64_t(storage.size() * 2 / rope::dtype_size(view.dtype));
    for (int64_t i = 0; i < count; ++i) {
        const float value = negative(rng()) ? -magnitude(rng()) : magnitude(rng());
        rope::dispatch_dtype(view.dtype, [&](auto storage_type) {
            using Storage = decltype(storage_type);
            static_cast<Storage*>(view.data)[i] = rope::from_float<Storage>(value);
        });
    }
}

void HostTensor::poison() {
    if (view.dtype == rope::DType::f32) {
        const float nan = std::nanf("");
        for (size_t i = 0; i + 1 < storage.size(); i += 2) std::memcpy(&storage[i], &nan, 4);
    } else {
        // 0x7e00 is a quiet NaN in binary16; 0x7fc0 in bfloat16.
        std::fill(storage.begin(), storage.end(), view.dtype == rope::DType::f16 ? 0x7e00 : 0x7fc0);
    }
}

rope::Positions Call::positions() const {
    rope::Positions positions = rope::Positions::starting_at(offset);
    if (!ids.empty()) {
        positions.ids = ids.data();
        positions.axes = id_axes;
        positions.rows = id_rows;
        positions.length = int64_t(ids.size()) / std::max<int64_t>(id_axes * id_rows, 1);
    }
    if (!cu_seqlens.empty()) {
        positions.cu_seqlens = cu_seqlens.data();
        positions.sequences = int64_t(cu_seqlens.size()) - 1;
    }
    if (!starts.empty()) positions.starts = starts.data();
    return positions.sharded(cp_size, cp_rank);
}

rope::CosSinCache Call::cos_sin_cache() const {
    if (table.empty()) return {};
    return rope::CosSinCache{table.data(), rope::DType::f32, rope::Device::host, table_rows, table_cols,
                             table_row_stride};
}

Call make_call(const rope::RopeConfig& config, rope::DType dtype, rope::Layout layout, std::array<int64_t, 4> q_shape,
               std::array<int64_t, 4> k_shape, int64_t pad, int64_t dim_stride) {
    Call call;
    call.config = config;
    call.q = HostTensor::make(dtype, layout, q_shape, pad, dim_stride);
    call.k = HostTensor::make(dtype, layout, k_shape, pad, dim_stride);
    call.q_out = HostTensor::make(dtype, layout, q_shape, pad, dim_stride);
    call.k_out = HostTensor::make(dtype, layout, k_shape, pad, dim_stride);
    call.q.fill_random();
    call.k.fill_random();
    call.q_out.poison();
    call.k_out.poison();
    return call;
}

HostTensor make_packed(rope::DType dtype, std::array<int64_t, 3> shape, int64_t pad, int64_t dim_stride) {
    HostTensor t = HostTensor::make(dtype, rope::Layout::bshd, {1, shape[0], shape[1], shape[2]}, pad, dim_stride);
    // The same storage seen as [tokens, heads, head_dim]: the unit batch axis dropped.
    const std::array<int64_t, 4> strides = t.view.strides;
    t.view.layout = rope::Layout::thd;
    t.view.shape = {shape[0], shape[1], shape[2], 1};
    t.view.strides = {strides[1], strides[2], strides[3], 1};
    return t;
}

Call make_packed_call(const rope::RopeConfig& config, rope::DType dtype, const std::vector<int64_t>& lengths,
                      int64_t q_heads, int64_t k_heads, int64_t pad) {
    Call call;
    call.config = config;
    call.cu_seqlens = {0};
    for (int64_t length : lengths) call.cu_seqlens.push_back(call.cu_seqlens.back() + length);
    const int64_t tokens = call.cu_seqlens.back();
    call.q = make_packed(dtype, {tokens, q_heads, config.head_dim}, pad);
    call.k = make_packed(dtype, {tokens, k_heads, config.head_dim}, pad);
    call.q_out = make_packed(dtype, {tokens, q_heads, config.head_dim}, pad);
    call.k_out = make_packed(dtype, {tokens, k_heads, config.head_dim}, pad);
    call.q.fill_random();
    call.k.fill_random();
    call.q_out.poison();
    call.k_out.poison();
    return call;
}

namespace {

// A device copy of one host tensor, same strides, padding included.
struct Staged {
    rope::Buffer buffer;
    rope::TensorView view;
};

Staged stage(const HostTensor& host) {
    Staged staged{rope::Buffer(rope::Device::cuda, host.bytes()), host.view};
    staged.buffer.copy_from_host(host.storage.data());
    staged.view.data = host.view.numel() > 0 ? staged.buffer.data() : nullptr;
    staged.view.device = rope::Device::cuda;
    return staged;
}

// A device copy of a host array (ids, cu_seqlens, starts, a table), or no buffer for an empty one.
template <typename T>
rope::Buffer stage_array(const std::vector<T>& host) {
    if (host.empty()) return {};
    rope::Buffer buffer(rope::Device::cuda, host.size() * sizeof(T));
    buffer.copy_from_host(host.data());
    return buffer;
}

// Largest position + 1 of the call, for device-resident ids or cu_seqlens,
// which rope cannot read (length-dependent scaling needs it): the largest id,
// or the last position of the longest-reaching packed sequence, unsharded.
int64_t position_bound(const Call& call) {
    int64_t bound = 0;
    for (int64_t id : call.ids) bound = std::max(bound, id + 1);
    if (!call.ids.empty()) return bound;
    for (size_t b = 0; b + 1 < call.cu_seqlens.size(); ++b) {
        const int64_t length = call.cu_seqlens[b + 1] - call.cu_seqlens[b];
        const int64_t start = b < call.starts.size() ? call.starts[b] : call.offset;
        if (length > 0) bound = std::max(bound, start + length * call.cp_size);
    }
    return bound;
}

}  // namespace

void run(rope::Backend& backend, Call& call, const std::function<void(rope::RopeArgs&)>& adjust) {
    rope::Positions positions = call.positions();
    if (backend.device() == rope::Device::host) {
        rope::RopeArgs args = call.in_place
                                        ? rope::RopeArgs::in_place(call.q.view, call.k.view, positions, call.direction)
                                        : rope::RopeArgs::out_of_place(call.q.view, call.k.view, call.q_out.view,
                                                                       call.k_out.view, positions, call.direction);
        args.cos_sin_cache = call.cos_sin_cache();
        if (adjust) adjust(args);
        rope::apply(backend, call.config, args);
        return;
    }
    Staged q = stage(call.q), k = stage(call.k), q_out = stage(call.q_out), k_out = stage(call.k_out);
    const rope::Buffer ids = stage_array(call.ids), cu_seqlens = stage_array(call.cu_seqlens),
                       starts = stage_array(call.starts), table = stage_array(call.table);
    if (!call.ids.empty()) positions.ids = static_cast<const int64_t*>(ids.data());
    if (!call.cu_seqlens.empty()) positions.cu_seqlens = static_cast<const int64_t*>(cu_seqlens.data());
    if (!call.starts.empty()) positions.starts = static_cast<const int64_t*>(starts.data());
    if (!call.ids.empty() || !call.cu_seqlens.empty() || !call.starts.empty()) {
        positions.device = rope::Device::cuda;
        // rope cannot read device-resident positions; length-dependent scaling needs their bound.
        positions.max_position = position_bound(call);
    }
    rope::RopeArgs args = call.in_place
                              ? rope::RopeArgs::in_place(q.view, k.view, positions, call.direction)
                              : rope::RopeArgs::out_of_place(q.view, k.view, q_out.view, k_out.view, positions,
                                                             call.direction);
    args.cos_sin_cache = call.cos_sin_cache();
    if (!call.table.empty()) {
        args.cos_sin_cache.data = table.data();
        args.cos_sin_cache.device = rope::Device::cuda;
    }
    if (adjust) adjust(args);
    // Copy the outputs back even when the call is rejected, so tests can see
    // that a rejected call left the device memory untouched.
    auto copy_back = [&] {
        rope::cuda_synchronize();
        if (call.in_place) {
            q.buffer.copy_to_host(call.q.storage.data());
            k.buffer.copy_to_host(call.k.storage.data());
        } else {
            q_out.buffer.copy_to_host(call.q_out.storage.data());
            k_out.buffer.copy_to_host(call.k_out.storage.data());
        }
    };
    try {
        rope::apply(backend, call.config, args);
    } catch (...) {
        copy_back();
        throw;
    }
    copy_back();
}

int& skipped_backend_tests() {
    static int count = 0;
    return count;
}

std::unique_ptr<rope::Backend> backend_or_skip(const std::string& name) {
    const rope::BackendInfo info = rope::backend_info(name);
    if (!info.available) {
        ++skipped_backend_tests();
        std::cout << "ROPE_SKIPPED " << name << ": " << info.reason << std::endl;
        return nullptr;
    }
    return rope::make_backend(name);
}

Expected oracle_for(const Call& call) {
    const rope::Positions positions = call.positions();
    if (!call.table.empty())
        return {oracle::rotate(call.config, call.q.view, positions, call.direction, call.cos_sin_cache()),
                oracle::rotate(call.config, call.k.view, positions, call.direction, call.cos_sin_cache())};
    return {oracle::rotate(call.config, call.q.view, positions, call.direction),
            oracle::rotate(call.config, call.k.view, positions, call.direction)};
}

double fp32_tolerance(int64_t max_position) { return 1.5e-6 + 1.2e-8 * double(max_position); }

double fp32_max_abs(int64_t max_position) { return 1e-5 + 3.4e-7 * double(max_position); }

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel_tol, double abs_tol,
                 const char* what) {
    const oracle::ErrorStats stats = oracle::compare(got, want);
    INFO(what << ": rel_l2 = " << stats.rel_l2 << " (tolerance " << rel_tol << "), max_abs = " << stats.max_abs
              << " (tolerance " << abs_tol << "), non-finite = " << stats.non_finite);
    CHECK(stats.non_finite == 0);
    CHECK(stats.rel_l2 <= rel_tol);
    CHECK(stats.max_abs <= abs_tol);
}

bool padding_untouched(const HostTensor& t) {
    std::vector<bool> inside(t.storage.size(), false);
    const int64_t units = rope::dtype_size(t.view.dtype) / 2;
    const auto& v = t.view;
    for (int64_t a = 0; a < v.shape[0]; ++a)
        for (int64_t b = 0; b < v.shape[1]; ++b)
            for (int64_t c = 0; c < v.shape[2]; ++c)
                for (int64_t d = 0; d < v.shape[3]; ++d) {
                    const int64_t e = a * v.strides[0] + b * v.strides[1] + c * v.strides[2] + d * v.strides[3];
                    for (int64_t u = 0; u < units; ++u) inside[size_t(e * units + u)] = true;
                }
    HostTensor poisoned = t;
    poisoned.poison();
    for (size_t i = 0; i < t.storage.size(); ++i)
        if (!inside[i] && t.storage[i] != poisoned.storage[i]) return false;
    return true;
}

void check_call(rope::Backend& backend, Call call, double oracle_rel, double oracle_abs) {
    CAPTURE(seed());
    const Expected want = oracle_for(call);
    Call reference = call;
    run(backend, call);
    check_close(call.q_result().values(), want.q, oracle_rel, oracle_abs, "q vs float64 oracle");
    check_close(call.k_result().values(), want.k, oracle_rel, oracle_abs, "k vs float64 oracle");
    if (!call.in_place) {
        CHECK_MESSAGE(padding_untouched(call.q_out), "q_out padding was written");
        CHECK_MESSAGE(padding_untouched(call.k_out), "k_out padding was written");
    }
    if (backend.name() != "cpu-naive") {
        auto naive = rope::make_backend("cpu-naive");
        run(*naive, reference);
        check_close(call.q_result().values(), reference.q_result().values(), agree_rel_l2, agree_max_abs,
                    "q vs cpu-naive");
        check_close(call.k_result().values(), reference.k_result().values(), agree_rel_l2, agree_max_abs,
                    "k vs cpu-naive");
    }
}

}  // namespace testing

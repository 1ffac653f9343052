#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <sstream>

#include <doctest/doctest.h>

namespace testing {
namespace {

// Calls f(e) for every element of the view, e being its offset in elements from view.data.
template <typename F>
void for_each_element(const rope::TensorView& v, F f) {
    for (int64_t a = 0; a < v.shape[0]; ++a)
        for (int64_t b = 0; b < v.shape[1]; ++b)
            for (int64_t c = 0; c < v.shape[2]; ++c)
                for (int64_t d = 0; d < v.shape[3]; ++d)
                    f(a * v.strides[0] + b * v.strides[1] + c * v.strides[2] + d * v.strides[3]);
}

// Which 2-byte units of the tensor's storage belong to an element of its view.
std::vector<bool> units_in_view(const HostTensor& t) {
    std::vector<bool> inside(t.storage.size(), false);
    const int64_t units = rope::dtype_size(t.view.dtype) / 2;
    for_each_element(t.view, [&](int64_t e) {
        for (int64_t u = 0; u < units; ++u) inside[size_t(t.offset_units + e * units + u)] = true;
    });
    return inside;
}

}  // namespace

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
    poison();
    std::uniform_real_distribution<float> magnitude(0.05f, 2.0f);
    std::bernoulli_distribution negative(0.5);
    for_each_element(view, [&](int64_t e) {
        const float value = negative(rng()) ? -magnitude(rng()) : magnitude(rng());
        rope::dispatch_dtype(view.dtype, [&](auto storage_type) {
            using Storage = decltype(storage_type);
            static_cast<Storage*>(view.data)[e] = rope::from_float<Storage>(value);
        });
    });
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

const char* arrangement_name(Arrangement arrangement) {
    switch (arrangement) {
        case Arrangement::dense: return "dense";
        case Arrangement::padded: return "padded";
        case Arrangement::dim_stride_2: return "dim_stride_2";
        case Arrangement::misaligned: return "misaligned";
        case Arrangement::transposed: return "transposed";
    }
    return "?";
}

std::string storage_name(const StorageOptions& options) {
    std::string name = arrangement_name(options.arrangement);
    if (options.tail > 0) name += "+tail" + std::to_string(options.tail);
    return name;
}

HostTensor HostTensor::arranged(rope::DType dtype, rope::Layout layout, std::array<int64_t, 4> shape,
                                const StorageOptions& options, std::mt19937_64& rng) {
    HostTensor t;
    t.view.dtype = dtype;
    t.view.layout = layout;
    t.view.device = rope::Device::host;
    t.view.shape = shape;
    // Axes in memory order, outermost first, features last. A thd view is
    // [tokens, heads, features, 1]: its unit axis takes no part.
    const bool packed = layout == rope::Layout::thd;
    const int head_axis = packed ? 1 : layout == rope::Layout::bhsd ? 1 : 2;
    const int seq_axis = packed ? 0 : layout == rope::Layout::bhsd ? 2 : 1;
    std::vector<int> order = packed ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 1, 2, 3};
    const Arrangement arrangement = options.arrangement;
    if (arrangement == Arrangement::transposed)
        std::swap(order[size_t(std::find(order.begin(), order.end(), head_axis) - order.begin())],
                  order[size_t(std::find(order.begin(), order.end(), seq_axis) - order.begin())]);
    // Padding: multiples of 8 elements keep every row 16-byte aligned in every
    // dtype (the CUDA vector path still applies), odd counts do not.
    const bool aligned_padding = rng() % 2 == 0;
    auto pad = [&]() -> int64_t {
        if (arrangement != Arrangement::padded) return 0;
        return aligned_padding ? int64_t(8 * (1 + rng() % 3)) : int64_t(1 + 2 * (rng() % 3));
    };
    int64_t stride = arrangement == Arrangement::dim_stride_2 ? 2 : 1;
    for (size_t i = order.size(); i-- > 0;) {
        const int axis = order[i];
        t.view.strides[size_t(axis)] = stride;
        stride = stride * std::max<int64_t>(shape[size_t(axis)], 1) + pad();
    }
    if (packed) t.view.strides[3] = 1;  // The unit axis (never stepped along).
    const int64_t lead = arrangement == Arrangement::misaligned ? 1 : 0;
    int64_t span = 0;  // Elements from the view's first to its last, inclusive.
    if (t.view.numel() > 0) {
        span = 1;
        for (int axis = 0; axis < 4; ++axis) span += (shape[size_t(axis)] - 1) * t.view.strides[size_t(axis)];
    }
    const int64_t units = rope::dtype_size(dtype) / 2;
    t.storage.assign(size_t((lead + span + options.tail) * units), 0);
    t.offset_units = lead * units;
    // std::vector's memory comes from operator new, 16-byte aligned on the
    // platforms we build for; one element in, the view is off that alignment.
    t.view.data = t.storage.data() + t.offset_units;
    return t;
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

void arrange(Call& call, const std::array<StorageOptions, 4>& storage, std::mt19937_64& rng) {
    HostTensor* tensors[] = {&call.q, &call.k, &call.q_out, &call.k_out};
    for (size_t i = 0; i < 4; ++i) {
        const rope::TensorView& old = tensors[i]->view;
        *tensors[i] = HostTensor::arranged(old.dtype, old.layout, old.shape, storage[i], rng);
        if (i < 2) tensors[i]->fill_random();
        else tensors[i]->poison();
    }
}

std::string unexpected_writes(const Call& before, const Call& after) {
    std::ostringstream problems;
    // `view_written`: the call was meant to write this tensor's view (and nothing else of it).
    auto compare = [&](const char* name, const HostTensor& was, const HostTensor& now, bool view_written) {
        REQUIRE(was.storage.size() == now.storage.size());
        const std::vector<bool> inside = view_written ? units_in_view(now) : std::vector<bool>(now.storage.size());
        for (size_t i = 0; i < now.storage.size(); ++i) {
            if (inside[i] || was.storage[i] == now.storage[i]) continue;
            problems << name << ": storage unit " << i << (view_written ? " outside the view" : "") << " was written"
                     << (view_written ? "" : " (this call must not write it)") << "; ";
            return;
        }
    };
    compare("q", before.q, after.q, after.in_place);
    compare("k", before.k, after.k, after.in_place);
    compare("q_out", before.q_out, after.q_out, !after.in_place);
    compare("k_out", before.k_out, after.k_out, !after.in_place);
    return problems.str();
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
    call.cu_seqlens = rope::cu_seqlens_from_lengths(lengths);
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

// A device copy of one host tensor's whole storage, its view re-pointed at the
// same byte offset, so a misaligned view stays misaligned on the device.
DeviceCall::Tensor stage(const HostTensor& host) {
    DeviceCall::Tensor staged{rope::Buffer(rope::Device::cuda, host.bytes()), host.view};
    staged.buffer.copy_from_host(host.storage.data());
    staged.view.data = host.view.numel() > 0 ? static_cast<uint16_t*>(staged.buffer.data()) + host.offset_units : nullptr;
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

DeviceCall::DeviceCall(const Call& call)
    : q(stage(call.q)), k(stage(call.k)), q_out(stage(call.q_out)), k_out(stage(call.k_out)) {
    rope::Positions positions = call.positions();
    ids = stage_array(call.ids);
    cu_seqlens = stage_array(call.cu_seqlens);
    starts = stage_array(call.starts);
    table = stage_array(call.table);
    if (!call.ids.empty()) positions.ids = static_cast<const int64_t*>(ids.data());
    if (!call.cu_seqlens.empty()) positions.cu_seqlens = static_cast<const int64_t*>(cu_seqlens.data());
    if (!call.starts.empty()) positions.starts = static_cast<const int64_t*>(starts.data());
    if (!call.ids.empty() || !call.cu_seqlens.empty() || !call.starts.empty()) {
        positions.device = rope::Device::cuda;
        // rope cannot read device-resident positions; length-dependent scaling needs their bound.
        positions.max_position = position_bound(call);
    }
    args = call.in_place ? rope::RopeArgs::in_place(q.view, k.view, positions, call.direction)
                         : rope::RopeArgs::out_of_place(q.view, k.view, q_out.view, k_out.view, positions,
                                                        call.direction);
    args.cos_sin_cache = call.cos_sin_cache();
    if (!call.table.empty()) {
        args.cos_sin_cache.data = table.data();
        args.cos_sin_cache.device = rope::Device::cuda;
    }
}

void DeviceCall::copy_back(Call& call) const {
    rope::cuda_synchronize();
    q.buffer.copy_to_host(call.q.storage.data());
    k.buffer.copy_to_host(call.k.storage.data());
    q_out.buffer.copy_to_host(call.q_out.storage.data());
    k_out.buffer.copy_to_host(call.k_out.storage.data());
}

void run(rope::Backend& backend, Call& call, const std::function<void(rope::RopeArgs&)>& adjust) {
    if (backend.device() == rope::Device::host) {
        const rope::Positions positions = call.positions();
        rope::RopeArgs args = call.in_place
                                        ? rope::RopeArgs::in_place(call.q.view, call.k.view, positions, call.direction)
                                        : rope::RopeArgs::out_of_place(call.q.view, call.k.view, call.q_out.view,
                                                                       call.k_out.view, positions, call.direction);
        args.cos_sin_cache = call.cos_sin_cache();
        if (adjust) adjust(args);
        rope::apply(backend, call.config, args);
        return;
    }
    DeviceCall device(call);
    rope::RopeArgs args = device.args;
    if (adjust) adjust(args);
    // Copy back even when the call is rejected, so tests can see that a
    // rejected call left the device memory untouched.
    try {
        rope::apply(backend, call.config, args);
    } catch (...) {
        device.copy_back(call);
        throw;
    }
    device.copy_back(call);
}

int& skipped_backend_tests() {
    static int count = 0;
    return count;
}

void report_skip(const std::string& what, const std::string& reason) {
    ++skipped_backend_tests();
    std::cout << "ROPE_SKIPPED " << what << ": " << reason << std::endl;
}

std::unique_ptr<rope::Backend> backend_or_skip(const std::string& name) {
    const rope::BackendInfo info = rope::backend_info(name);
    if (!info.available) {
        report_skip(name, info.reason);
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

Tolerance oracle_tolerance(rope::DType dtype, int64_t max_position) {
    const Tolerance float32{fp32_tolerance(max_position), fp32_max_abs(max_position)};
    switch (dtype) {
        case rope::DType::bf16: return {4e-3 + float32.rel_l2, 1.0 / 128 + float32.max_abs};
        case rope::DType::f16: return {5e-4 + float32.rel_l2, 1.0 / 1024 + float32.max_abs};
        case rope::DType::f32: break;
    }
    return float32;
}

Tolerance naive_agreement(rope::DType dtype) {
    switch (dtype) {
        case rope::DType::bf16: return {1.0 / 256, 1.0 / 64};
        case rope::DType::f16: return {1.0 / 2048, 1.0 / 512};
        case rope::DType::f32: break;
    }
    return {5e-7, 4e-6};
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel_tol, double abs_tol,
                 const char* what) {
    const oracle::ErrorStats stats = oracle::compare(got, want);
    INFO(what << ": rel_l2 = " << stats.rel_l2 << " (tolerance " << rel_tol << "), max_abs = " << stats.max_abs
              << " (tolerance " << abs_tol << "), non-finite = " << stats.non_finite);
    CHECK(stats.non_finite == 0);
    CHECK(stats.rel_l2 <= rel_tol);
    CHECK(stats.max_abs <= abs_tol);
}

void check_call(rope::Backend& backend, Call call, double oracle_rel, double oracle_abs) {
    CAPTURE(seed());
    const Expected want = oracle_for(call);
    const Call before = call;
    run(backend, call);
    check_close(call.q_result().values(), want.q, oracle_rel, oracle_abs, "q vs float64 oracle");
    check_close(call.k_result().values(), want.k, oracle_rel, oracle_abs, "k vs float64 oracle");
    const std::string writes = unexpected_writes(before, call);
    CHECK_MESSAGE(writes.empty(), writes);
    if (backend.name() != "cpu-naive") {
        auto naive = rope::make_backend("cpu-naive");
        Call reference = before;
        run(*naive, reference);
        const Tolerance agree = naive_agreement(call.q.view.dtype);
        check_close(call.q_result().values(), reference.q_result().values(), agree.rel_l2, agree.max_abs,
                    "q vs cpu-naive");
        check_close(call.k_result().values(), reference.k_result().values(), agree.rel_l2, agree.max_abs,
                    "k vs cpu-naive");
    }
}

}  // namespace testing

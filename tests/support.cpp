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
    if (!ids.empty()) return rope::Positions::per_sequence(ids.data(), id_rows, int64_t(ids.size()) / id_rows);
    return rope::Positions::starting_at(offset);
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

}  // namespace

void run(rope::Backend& backend, Call& call, const std::function<void(rope::RopeArgs&)>& adjust) {
    rope::Positions positions = call.positions();
    if (backend.device() == rope::Device::host) {
        rope::RopeArgs args = call.in_place
                                        ? rope::RopeArgs::in_place(call.q.view, call.k.view, positions, call.direction)
                                        : rope::RopeArgs::out_of_place(call.q.view, call.k.view, call.q_out.view,
                                                                       call.k_out.view, positions, call.direction);
        if (adjust) adjust(args);
        rope::apply(backend, call.config, args);
        return;
    }
    Staged q = stage(call.q), k = stage(call.k), q_out = stage(call.q_out), k_out = stage(call.k_out);
    rope::Buffer ids;
    if (!call.ids.empty()) {
        ids = rope::Buffer(rope::Device::cuda, call.ids.size() * sizeof(int64_t));
        ids.copy_from_host(call.ids.data());
        positions.ids = static_cast<const int64_t*>(ids.data());
        positions.device = rope::Device::cuda;
        // rope cannot read device-resident ids; length-dependent scaling needs their bound.
        positions.max_position = *std::max_element(call.ids.begin(), call.ids.end()) + 1;
    }
    rope::RopeArgs args = call.in_place
                              ? rope::RopeArgs::in_place(q.view, k.view, positions, call.direction)
                              : rope::RopeArgs::out_of_place(q.view, k.view, q_out.view, k_out.view, positions,
                                                             call.direction);
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
    return {oracle::rotate(call.config, call.q.view, positions, call.direction),
            oracle::rotate(call.config, call.k.view, positions, call.direction)};
}

double fp32_tolerance(int64_t max_position) { return 1.5e-6 + 1.2e-8 * double(max_position); }

double fp32_max_abs(int64_t max_position) { return 1e-5 + 3.4e-7 * double(max_position); }

}  // namespace testing

// One shape under one position form on one device (see workload.hpp).
#include "workload.hpp"

#include <algorithm>
#include <cstring>

#include "random.hpp"
#include "rope/dtype.hpp"
#include "rope/rope.hpp"

namespace rope_bench {
namespace {

// Random values of magnitude in [0.25, 1) and random sign: never zero, never denormal.
template <typename Storage>
void fill_random(Storage* data, int64_t count) {
    constexpr int64_t kChunk = int64_t(1) << 16;
    const int64_t chunks = (count + kChunk - 1) / kChunk;
#if ROPE_BENCH_OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        uint64_t state = uint64_t(chunk) * 7919u + 1u;  // Seeded per chunk: the same data whatever the threads.
        const int64_t end = std::min(count, (chunk + 1) * kChunk);
        for (int64_t i = chunk * kChunk; i < end; ++i) {
            const uint64_t bits = split_mix(state);
            const float magnitude = 0.25f + 0.75f * float(bits >> 40) / float(uint64_t(1) << 24);
            data[i] = rope::from_float<Storage>((bits & 1u) ? -magnitude : magnitude);
        }
    }
}

// A buffer of `bytes` on `device` holding random values of `dtype`.
rope::Buffer random_buffer(rope::Device device, rope::DType dtype, std::size_t bytes) {
    rope::Buffer buffer(device, bytes);
    const int64_t count = int64_t(bytes) / rope::dtype_size(dtype);
    std::vector<char> staging(device == rope::Device::host ? 0 : bytes);
    void* fill_at = device == rope::Device::host ? buffer.data() : static_cast<void*>(staging.data());
    rope::dispatch_dtype(dtype, [&](auto storage) { fill_random(static_cast<decltype(storage)*>(fill_at), count); });
    if (device != rope::Device::host) buffer.copy_from_host(staging.data());
    return buffer;
}

// A copy of `values` on `device` (an empty buffer for no values).
template <typename Value>
rope::Buffer on_device(const std::vector<Value>& values, rope::Device device) {
    rope::Buffer buffer(device, values.size() * sizeof(Value));
    if (!values.empty()) buffer.copy_from_host(values.data());
    return buffer;
}

}  // namespace

CacheSize cache_to_defeat(const Options& options, rope::Device device) {
    if (options.llc_mb > 0) return {std::size_t(options.llc_mb * double(1 << 20)), "--llc-mb"};
#if ROPE_BENCH_CUDA
    if (device != rope::Device::host) return {cuda_l2_bytes(), "cudaDevAttrL2CacheSize"};
#endif
    (void)device;
    return host_last_level_cache();
}

Workload::Workload(const Options& options, const Form& form, rope::Device device)
    : options_(options), device_(device), cache_(cache_to_defeat(options, device)), config_(form.config) {
    const std::size_t element_bytes = std::size_t(rope::dtype_size(options.dtype));
    const std::size_t q_bytes = std::size_t(form.batch * form.seq * form.q_heads * form.head_dim) * element_bytes;
    set_bytes_ = std::size_t(form.elements()) * element_bytes;
    stride_ = set_stride(set_bytes_);
    sets_ = sets_spanning_twice(set_bytes_, cache_.bytes);  // No call finds its inputs in cache.
    inputs_ = random_buffer(device, options.dtype, stride_ * std::size_t(sets_));
    if (!options.in_place) outputs_ = rope::Buffer(device, inputs_.bytes());
    cu_seqlens_ = on_device(form.cu_seqlens, device);
    ids_ = on_device(form.ids, device);
    table_ = on_device(form.cos_sin, device);
#if ROPE_BENCH_CUDA
    if (device != rope::Device::host) stream_ = std::make_unique<CudaStream>();
#endif

    const rope::Positions positions = form.positions(static_cast<const int64_t*>(cu_seqlens_.data()),
                                                     static_cast<const int64_t*>(ids_.data()), device);
    auto view = [&](rope::Buffer& buffer, int64_t index, bool is_k) {
        char* at = set(static_cast<char*>(buffer.data()), index) + (is_k ? q_bytes : 0);
        return form.view(at, is_k ? form.k_heads : form.q_heads, options.dtype, device);
    };
    for (int64_t index = 0; index < sets_; ++index) {
        const rope::TensorView q = view(inputs_, index, false), k = view(inputs_, index, true);
        rope::RopeArgs args = options.in_place ? rope::RopeArgs::in_place(q, k, positions)
                                               : rope::RopeArgs::out_of_place(q, k, view(outputs_, index, false),
                                                                              view(outputs_, index, true), positions);
        args.cos_sin_cache = form.cos_sin_cache(static_cast<const float*>(table_.data()), device);
#if ROPE_BENCH_CUDA
        if (stream_) args.stream = stream_->get();
#endif
        if (index == 0) first_args_ = args;
        plans_.push_back(rope::make_plan(config_, args, device));
    }
}

std::string Workload::refusal(rope::Backend& backend) const {
    try {
        rope::apply(backend, config_, first_args_);
    } catch (const rope::Error& error) {
        return error.what();
    }
    return {};
}

Measurement Workload::measure(rope::Backend& backend, [[maybe_unused]] int threads) {
    if (copy_destination_.bytes() == 0) {
        copy_destination_ = rope::Buffer(device_, inputs_.bytes());
        if (device_ == rope::Device::host)
            std::memset(copy_destination_.data(), 0, copy_destination_.bytes());  // Fault the pages in now.
    }
    auto call = [&](int64_t c) { backend.run(plans_[std::size_t(c % sets_)]); };
    if (device_ == rope::Device::host) {
        const HostSets host_sets{static_cast<char*>(inputs_.data()), static_cast<char*>(copy_destination_.data()),
                                 set_bytes_, stride_, sets_};
        return host_measure(call, host_sets, threads, options_.reps);
    }
#if ROPE_BENCH_CUDA
    const DeviceSets device_sets{inputs_.data(), copy_destination_.data(), set_bytes_, stride_, sets_};
    return cuda_measure(call, options_.graph ? GpuClock::graph : GpuClock::events, options_.reps > 0 ? options_.reps : kDefaultGpuReps,
                        device_sets, stream_->get());
#else
    rope::fail("device", "cuda", "rope-bench was built without CUDA timing");
#endif
}

}  // namespace rope_bench

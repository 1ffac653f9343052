// The unfused pair's cache write (append_baseline.hpp): the baseline rope-bench --op append measures the
// fused call against.
#include <cuda_runtime.h>

#include <cstring>

#include "append_baseline.hpp"
#include "rope/cuda_check.hpp"
#include "rope/error.hpp"
#include "rope/fp8.hpp"

namespace rope_bench {
namespace {

constexpr int kThreads = 128;

// Block t scatters token t: items [0, heads x runs) are k's 16-byte runs, the next as many v's.
template <typename Storage>
__global__ void scatter_kv(const ScatterCall call) {
    constexpr int kWidth = 16 / int(sizeof(Storage));
    const int64_t token = blockIdx.x;
    const int64_t slot = call.slots[token];
    if (slot < 0) return;
    const int64_t runs = call.head_dim / kWidth;
    const int64_t items = call.heads * runs;
    const int64_t row = (slot / call.page_size) * call.stride_page + (slot % call.page_size) * call.stride_slot;
    for (int64_t i = threadIdx.x; i < 2 * items; i += blockDim.x) {
        const bool is_v = i >= items;
        const int64_t j = is_v ? i - items : i;
        const int64_t head = j / runs, feature = (j % runs) * kWidth;
        const auto* source = static_cast<const Storage*>(is_v ? call.v : call.k) +
                             (token * call.heads + head) * call.head_dim + feature;
        const uint4 data = *reinterpret_cast<const uint4*>(source);
        const int64_t at = row + head * call.stride_head + feature;
        void* cache = is_v ? call.v_cache : call.k_cache;
        if (call.cache_dtype == rope::CacheDType::model) {
            *reinterpret_cast<uint4*>(static_cast<Storage*>(cache) + at) = data;
            continue;
        }
        Storage values[kWidth];
        memcpy(values, &data, sizeof data);
        const float scale = *(is_v ? call.v_scale : call.k_scale);
        const rope::Fp8Format format =
            call.cache_dtype == rope::CacheDType::e4m3fn ? rope::Fp8Format::e4m3fn : rope::Fp8Format::e5m2;
        uint32_t word[kWidth / 4] = {};
#pragma unroll
        for (int w = 0; w < kWidth; ++w)
            word[w / 4] |= uint32_t(rope::quantize_fp8(rope::to_float(values[w]), scale, format)) << (8 * (w % 4));
        uint8_t* target = static_cast<uint8_t*>(cache) + at;
        if constexpr (kWidth == 8)
            *reinterpret_cast<uint2*>(target) = make_uint2(word[0], word[1]);
        else
            *reinterpret_cast<uint32_t*>(target) = word[0];
    }
}

}  // namespace

void scatter_kv_async(const ScatterCall& call, void* stream) {
    const int64_t width = 16 / rope::dtype_size(call.dtype);
    if (call.head_dim % width != 0)
        rope::fail("head_dim", call.head_dim, "the baseline scatter moves 16-byte runs: a multiple of " +
                                                  std::to_string(width) + " needed");
    if (call.tokens == 0) return;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned(call.tokens));
    config.blockDim = dim3(kThreads);
    config.stream = static_cast<cudaStream_t>(stream);
    rope::dispatch_dtype(call.dtype, [&](auto storage) {
        rope::check_cuda(cudaLaunchKernelEx(&config, scatter_kv<decltype(storage)>, call), "scatter_kv launch");
    });
}

}  // namespace rope_bench

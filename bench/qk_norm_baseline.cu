// The unfused pair's RMSNorm (qk_norm_baseline.hpp): the baseline rope-bench --op qknorm measures the fused
// call against.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>

#include "qk_norm_baseline.hpp"
#include "rope/cuda_check.hpp"
#include "rope/error.hpp"

namespace rope_bench {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 128;       // Four rows per block.
constexpr int kMaxRunsPerLane = 8;  // head_dim up to 8 x 32 x 16 bytes held in registers between the passes.

// Warp w of the grid normalises row w: each lane holds its 16-byte runs (lane, lane + 32, ...), the warp adds
// their squares by shuffles, then each lane writes back what it read.
template <typename Storage>
__global__ void rms_norm_rows(const NormRows call) {
    constexpr int kWidth = 16 / int(sizeof(Storage));
    const int lane = int(threadIdx.x) % kWarp;
    const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
    if (row >= call.rows) return;  // The whole warp leaves together.
    const int runs = int(call.head_dim / kWidth);
    auto* data = static_cast<Storage*>(call.data) + row * call.head_dim;
    const auto* weight = static_cast<const Storage*>(call.weight);
    uint4 held[kMaxRunsPerLane];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxRunsPerLane; ++j) {
        const int run = lane + j * kWarp;
        if (run >= runs) break;
        held[j] = reinterpret_cast<const uint4*>(data)[run];
        Storage values[kWidth];
        memcpy(values, &held[j], sizeof values);
#pragma unroll
        for (int w = 0; w < kWidth; ++w) sum += rope::to_float(values[w]) * rope::to_float(values[w]);
    }
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float inverse = rsqrtf(sum / float(call.head_dim) + call.eps);
#pragma unroll
    for (int j = 0; j < kMaxRunsPerLane; ++j) {
        const int run = lane + j * kWarp;
        if (run >= runs) break;
        Storage values[kWidth], weights[kWidth];
        memcpy(values, &held[j], sizeof values);
        const uint4 w4 = reinterpret_cast<const uint4*>(weight)[run];
        memcpy(weights, &w4, sizeof weights);
#pragma unroll
        for (int w = 0; w < kWidth; ++w) {
            const float x_hat = rope::to_float(rope::from_float<Storage>(rope::to_float(values[w]) * inverse));
            values[w] = rope::from_float<Storage>(rope::to_float(weights[w]) * x_hat);
        }
        uint4 out;
        memcpy(&out, values, sizeof out);
        reinterpret_cast<uint4*>(data)[run] = out;
    }
}

}  // namespace

void rms_norm_async(const NormRows& call, void* stream) {
    const int64_t width = 16 / rope::dtype_size(call.dtype);
    if (call.head_dim % width != 0 || call.head_dim / width > int64_t(kMaxRunsPerLane) * kWarp)
        rope::fail("head_dim", call.head_dim,
                   "the baseline RMSNorm moves 16-byte runs: a multiple of " + std::to_string(width) +
                       ", at most " + std::to_string(width * kMaxRunsPerLane * kWarp) + " needed");
    for (const void* pointer : {static_cast<const void*>(call.data), call.weight})
        if (reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0)
            rope::fail("baseline RMSNorm pointer", reinterpret_cast<std::uintptr_t>(pointer),
                       "must be 16-byte aligned");
    if (call.rows == 0) return;
    const int64_t blocks = (call.rows * kWarp + kThreads - 1) / kThreads;
    if (blocks > INT_MAX) rope::fail("baseline RMSNorm rows", call.rows, "too many for one launch");
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned(blocks));
    config.blockDim = dim3(kThreads);
    config.stream = static_cast<cudaStream_t>(stream);
    rope::dispatch_dtype(call.dtype, [&](auto storage) {
        rope::check_cuda(cudaLaunchKernelEx(&config, rms_norm_rows<decltype(storage)>, call), "rms_norm_rows launch");
    });
}

}  // namespace rope_bench

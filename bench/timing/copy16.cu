// The timer's two kernels (see cuda_timing.hpp): the spin a timed batch waits behind, and the copy
// ceiling's own kernel, a plain copy that moves its bytes the way the fastest RoPE kernels do, 16 bytes
// per load and per store, with several loads in flight per thread before the first store. A RoPE kernel
// that matches it moves its bytes as fast as any copy can.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda_timing.hpp"
#include "rope/cuda_check.hpp"
#include "rope/error.hpp"

namespace rope_bench {
namespace {

constexpr int kThreads = 256;         // Per block.
constexpr int kVectorsPerThread = 4;  // 16-byte loads a thread issues before its first store.

// Block b copies vectors [b * 1024, (b + 1) * 1024), thread t those at
// t, t + 256, t + 512, t + 768 of its block (each warp-wide access one
// contiguous 512-byte run). Then the first `tail` threads of the grid copy the
// bytes past the last whole vector.
__global__ void copy16(const int4* __restrict__ source, int4* __restrict__ destination, int64_t vectors,
                       const unsigned char* __restrict__ tail_source, unsigned char* __restrict__ tail_destination,
                       int64_t tail) {
    const int64_t first = int64_t(blockIdx.x) * kThreads * kVectorsPerThread + threadIdx.x;
    int4 held[kVectorsPerThread] = {};
#pragma unroll
    for (int j = 0; j < kVectorsPerThread; ++j) {
        const int64_t i = first + int64_t(j) * kThreads;
        if (i < vectors) held[j] = source[i];
    }
#pragma unroll
    for (int j = 0; j < kVectorsPerThread; ++j) {
        const int64_t i = first + int64_t(j) * kThreads;
        if (i < vectors) destination[i] = held[j];
    }
    const int64_t thread = int64_t(blockIdx.x) * kThreads + threadIdx.x;
    if (thread < tail) tail_destination[thread] = tail_source[thread];
}

// One thread waits until the GPU's global timer has moved `nanoseconds` on.
__global__ void spin(uint64_t nanoseconds) {
    uint64_t start = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanoseconds);
}

}  // namespace

void cuda_spin_async(double microseconds, void* stream) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(1);
    config.blockDim = dim3(1);
    config.stream = static_cast<cudaStream_t>(stream);
    rope::check_cuda(cudaLaunchKernelEx(&config, spin, uint64_t(std::max(microseconds, 0.0) * 1000.0)), "spin launch");
}

void cuda_copy16_async(void* destination, const void* source, std::size_t bytes, void* stream) {
    if (reinterpret_cast<std::uintptr_t>(source) % 16 != 0)
        rope::fail("copy16 source", reinterpret_cast<std::uintptr_t>(source), "must be 16-byte aligned");
    if (reinterpret_cast<std::uintptr_t>(destination) % 16 != 0)
        rope::fail("copy16 destination", reinterpret_cast<std::uintptr_t>(destination), "must be 16-byte aligned");
    if (bytes == 0) return;  // Nothing to copy, and a grid of no blocks is not a valid launch.
    const int64_t vectors = int64_t(bytes / 16);
    const int64_t tail = int64_t(bytes % 16);
    const int64_t per_block = int64_t(kThreads) * kVectorsPerThread;
    const int64_t blocks = std::max<int64_t>((vectors + per_block - 1) / per_block, 1);
    const auto* from = static_cast<const unsigned char*>(source);
    auto* to = static_cast<unsigned char*>(destination);
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned(blocks));
    config.blockDim = dim3(kThreads);
    config.stream = static_cast<cudaStream_t>(stream);
    // cudaLaunchKernelEx returns this launch's own status (see cuda/check.hpp for why not <<<>>>).
    rope::check_cuda(cudaLaunchKernelEx(&config, copy16, reinterpret_cast<const int4*>(from),
                                        reinterpret_cast<int4*>(to), vectors, from + vectors * 16, to + vectors * 16,
                                        tail),
                     "copy16 launch");
}

}  // namespace rope_bench

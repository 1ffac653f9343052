// The kernel behind rounding_device.hpp: detail::round_pair_to<bfloat16> (the paired
// conversion instruction on the GPU), applied to the values the host rounds one at a time.
#include "rounding_device.hpp"

#include <cuda_runtime_api.h>

#include "rope/cuda_check.hpp"
#include "rope/detail/qk_norm_plan.hpp"

namespace testing::cuda {

namespace {

__global__ void round_pairs(float* values, int64_t pairs) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < pairs) rope::detail::round_pair_to<rope::bfloat16>(values[2 * i], values[2 * i + 1]);
}

}  // namespace

std::vector<float> bf16_pairs_on_device(const std::vector<float>& values) {
    std::vector<float> pairs = values;
    if (pairs.size() % 2 != 0) pairs.push_back(0.0f);
    const size_t bytes = pairs.size() * sizeof(float);
    float* device = nullptr;
    rope::check_cuda(cudaMalloc(&device, bytes == 0 ? 1 : bytes), "cudaMalloc");
    try {
        rope::check_cuda(cudaMemcpy(device, pairs.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        const int64_t count = int64_t(pairs.size() / 2);
        round_pairs<<<unsigned((count + 255) / 256 + 1), 256>>>(device, count);
        rope::check_cuda(cudaGetLastError(), "round_pairs<<<>>>");
        rope::check_cuda(cudaMemcpy(pairs.data(), device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    } catch (...) {
        cudaFree(device);
        throw;
    }
    rope::check_cuda(cudaFree(device), "cudaFree");
    pairs.resize(values.size());
    return pairs;
}

}  // namespace testing::cuda

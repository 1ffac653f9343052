// The kernel behind fp8_device.hpp: rope/fp8.hpp's functions, compiled by nvcc
// for the GPU, applied to the values the host test converts too.
#include "fp8_device.hpp"

#include <cuda_runtime_api.h>

#include <cstring>
#include <stdexcept>

#include "rope/cuda_check.hpp"
#include "rope/fp8.hpp"

namespace testing::cuda {

namespace {

__global__ void convert(const float* values, int64_t count, float scale, uint8_t* e4m3fn, uint8_t* e5m2,
                        uint8_t* e4m3fn_quantized, uint8_t* e5m2_quantized, float* e4m3fn_decoded,
                        float* e5m2_decoded) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < count) {
        e4m3fn[i] = rope::float_to_e4m3fn(values[i]);
        e5m2[i] = rope::float_to_e5m2(values[i]);
        e4m3fn_quantized[i] = rope::quantize_fp8(values[i], scale, rope::Fp8Format::e4m3fn);
        e5m2_quantized[i] = rope::quantize_fp8(values[i], scale, rope::Fp8Format::e5m2);
    }
    if (i < 256) {
        e4m3fn_decoded[i] = rope::e4m3fn_to_float(uint8_t(i));
        e5m2_decoded[i] = rope::e5m2_to_float(uint8_t(i));
    }
}

// Fp8Quantizer::quantize4 as the append kernel calls it: four values a thread, one word of codes.
__global__ void quantize(const float* values, int64_t count, float scale, uint8_t* e4m3fn, uint8_t* e5m2) {
    const int64_t first = 4 * (int64_t(blockIdx.x) * blockDim.x + threadIdx.x);
    if (first >= count) return;
    float four[4];
    for (int i = 0; i < 4; ++i) four[i] = first + i < count ? values[first + i] : 0.0f;
    const uint32_t codes[2] = {rope::Fp8Quantizer<rope::Fp8Format::e4m3fn>(scale).quantize4(four),
                               rope::Fp8Quantizer<rope::Fp8Format::e5m2>(scale).quantize4(four)};
    for (int i = 0; i < 4 && first + i < count; ++i) {
        e4m3fn[first + i] = uint8_t(codes[0] >> (8 * i));
        e5m2[first + i] = uint8_t(codes[1] >> (8 * i));
    }
}

// Device memory freed with the object.
struct DeviceArray {
    void* data = nullptr;
    explicit DeviceArray(size_t bytes) { rope::check_cuda(cudaMalloc(&data, bytes == 0 ? 1 : bytes), "cudaMalloc"); }
    ~DeviceArray() { cudaFree(data); }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
};

// One run of both kernels over outputs first filled with @p poison bytes.
Fp8DeviceResults run_once(const DeviceArray& in, size_t count, float scale, unsigned char poison) {
    DeviceArray codes(6 * count), decoded(2 * 256 * sizeof(float));
    rope::check_cuda(cudaMemset(codes.data, poison, 6 * count), "cudaMemset");
    rope::check_cuda(cudaMemset(decoded.data, poison, 2 * 256 * sizeof(float)), "cudaMemset");
    auto* code_bytes = static_cast<uint8_t*>(codes.data);
    auto* decoded_floats = static_cast<float*>(decoded.data);
    const size_t threads = count > 256 ? count : 256;
    convert<<<unsigned((threads + 255) / 256), 256>>>(static_cast<const float*>(in.data), int64_t(count), scale,
                                                      code_bytes, code_bytes + count, code_bytes + 2 * count,
                                                      code_bytes + 3 * count, decoded_floats, decoded_floats + 256);
    rope::check_cuda(cudaGetLastError(), "convert<<<>>>");
    const size_t quads = (count + 3) / 4;
    quantize<<<unsigned((quads + 255) / 256 + (quads == 0)), 256>>>(static_cast<const float*>(in.data),
                                                                       int64_t(count), scale, code_bytes + 4 * count,
                                                                       code_bytes + 5 * count);
    rope::check_cuda(cudaGetLastError(), "quantize<<<>>>");
    Fp8DeviceResults results;
    std::vector<uint8_t>* outputs[] = {&results.e4m3fn,         &results.e5m2,
                                       &results.e4m3fn_quantized, &results.e5m2_quantized,
                                       &results.e4m3fn_quantizer, &results.e5m2_quantizer};
    results.e4m3fn_decoded.resize(256);
    results.e5m2_decoded.resize(256);
    for (int k = 0; k < 6; ++k) {
        outputs[k]->resize(count);
        rope::check_cuda(cudaMemcpy(outputs[k]->data(), code_bytes + k * count, count, cudaMemcpyDeviceToHost),
                         "cudaMemcpy");
    }
    rope::check_cuda(cudaMemcpy(results.e4m3fn_decoded.data(), decoded_floats, 256 * sizeof(float),
                                cudaMemcpyDeviceToHost), "cudaMemcpy");
    rope::check_cuda(cudaMemcpy(results.e5m2_decoded.data(), decoded_floats + 256, 256 * sizeof(float),
                                cudaMemcpyDeviceToHost), "cudaMemcpy");
    return results;
}

}  // namespace

Fp8DeviceResults fp8_on_device(const std::vector<float>& values, float scale) {
    const size_t count = values.size();
    DeviceArray in(count * sizeof(float));
    rope::check_cuda(cudaMemcpy(in.data, values.data(), count * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    // Two runs over outputs poisoned with different bytes: an element no thread writes keeps its
    // poison, so the runs disagree there, whatever code the test expects.
    const Fp8DeviceResults first = run_once(in, count, scale, 0x00), second = run_once(in, count, scale, 0xff);
    const bool same = first.e4m3fn == second.e4m3fn && first.e5m2 == second.e5m2 &&
                      first.e4m3fn_quantized == second.e4m3fn_quantized &&
                      first.e5m2_quantized == second.e5m2_quantized &&
                      first.e4m3fn_quantizer == second.e4m3fn_quantizer &&
                      first.e5m2_quantizer == second.e5m2_quantizer &&
                      std::memcmp(first.e4m3fn_decoded.data(), second.e4m3fn_decoded.data(), 256 * sizeof(float)) == 0 &&
                      std::memcmp(first.e5m2_decoded.data(), second.e5m2_decoded.data(), 256 * sizeof(float)) == 0;
    if (!same) throw std::runtime_error("fp8_on_device: an output element was written by no thread (poisoned runs differ)");
    return first;
}

}  // namespace testing::cuda
